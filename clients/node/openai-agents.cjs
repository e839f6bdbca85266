'use strict';
// The OpenAI Agents SDK for JS adapter (`import { idempotentFunctionTool } from
// 'idemgate/openai-agents'`): a function tool (what `tool({...})` returns) whose calls run once
// per action, keyed by the call's `callId` within the conversation.
const { KEY_ARGUMENT, KEY_DESCRIPTION, policyFields, toolCall } = require('./tool-calls.cjs');

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
  const name = fnTool.name;
  const policy = policyFields(options);
  engine.policy(name, policy);
  const declared = KEY_ARGUMENT in (fnTool.parameters?.properties ?? {});
  const injected = options.modelKey !== false && !declared;
  return {
    ...fnTool,
    parameters: injected ? withKeyParameter(fnTool.parameters, fnTool.strict) : fnTool.parameters,
    invoke: (runContext, input, details) => {
      const parsed = JSON.parse(input || '{}');
      return toolCall(engine, name, parsed, runContext, options, {
        callId: details?.toolCall?.callId,
        defaultScope: runContext?.context?.conversationId,
        signal: details?.signal,
        policy,
      }, (args) => fnTool.invoke(runContext, JSON.stringify(injected ? args : parsed), details));
    },
  };
}

module.exports = { idempotentFunctionTool };
