'use strict';
// The OpenAI Agents SDK for JS adapter (`import { idempotentFunctionTool } from
// 'idemgate/openai-agents'`): a function tool (what `tool({...})` returns) whose calls run once
// per action, keyed by the call's `callId` within the conversation.
const { POLICY_FIELDS } = require('./engine.cjs');
const { KEY_ARGUMENT, KEY_DESCRIPTION, nameAction, callOnce, answer, jsonable, splitModelKey } = require('./tool-calls.cjs');

/** The tool's JSON schema with the model's optional `idempotency_key` (in strict mode every
 * property is required, so it is a nullable string there). */
function withKeyParameter(parameters, strict) {
  const property = strict
    ? { type: ['string', 'null'], description: KEY_DESCRIPTION }
    : { type: 'string', description: KEY_DESCRIPTION };
  return {
    ...parameters,
    properties: { ...(parameters.properties ?? {}), [KEY_ARGUMENT]: property },
    required: strict ? [...(parameters.required ?? []), KEY_ARGUMENT] : parameters.required ?? [],
  };
}

/** `fnTool` (a `FunctionTool`) run through `engine` under its name, once per action (the rules
 * of `idemgate/ai`'s `idempotentTool`): the same `callId` answers the stored result; an identical
 * call re-emitted under a new id in the conversation within the window is not run again and the
 * model reads that it already ran; another conversation, or the model's `idempotency_key`, is
 * another action. `scope(input, runContext)` (or a string) names the conversation (default:
 * `runContext.context?.conversationId`); `key(input, runContext)` names the action by its business
 * identity. */
function idempotentFunctionTool(engine, fnTool, options = {}) {
  const { scope, key, modelKey = true } = options;
  const name = fnTool.name;
  const policy = {};
  for (const f of [...POLICY_FIELDS, 'window']) if (options[f] !== undefined) policy[f] = options[f];
  engine.policy(name, policy);
  const declared = KEY_ARGUMENT in (fnTool.parameters?.properties ?? {});
  const injected = modelKey && !declared;
  return {
    ...fnTool,
    parameters: injected ? withKeyParameter(fnTool.parameters, fnTool.strict) : fnTool.parameters,
    invoke: async (runContext, input, details) => {
      const parsed = JSON.parse(input || '{}');
      const [given, rest] = splitModelKey(parsed, modelKey);
      const passed = injected ? rest : parsed;
      const conversation =
        typeof scope === 'function' ? scope(rest, runContext) : (scope ?? runContext?.context?.conversationId ?? null);
      const action = nameAction({
        callId: details?.toolCall?.callId ?? null,
        scope: conversation ?? null,
        businessKey: key ? key(rest, runContext) : null,
        modelKey: given,
      });
      const run = () => fnTool.invoke(runContext, JSON.stringify(passed), details);
      return answer(await callOnce(engine, name, action, jsonable(rest), run, policy, details?.signal));
    },
  };
}

module.exports = { idempotentFunctionTool };
