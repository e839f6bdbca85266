'use strict';
// The OpenAI Agents SDK for JS adapter (`import { idempotentFunctionTool } from
// 'idemgate/openai-agents'`): a function tool (what `tool({...})` returns) whose calls run once
// per action, keyed by the call's `callId` within the conversation.
const { KEY_ARGUMENT, keyProperty, policyFields, scopesByObject, toolCall } = require('./tool-calls.cjs');

/** The scope of a run, by its RunContext. The SDK hands a tool the run's RunContext (one per
 * `run()`, the same object in every turn of that run and when it resumes after an approval) but
 * no conversation id, and a program's `context` object may be shared by many conversations (a
 * user's), so without `context.conversationId` the run is the scope: an identical call
 * re-emitted later in the run (after a tool timeout) is joined, and another run never is. */
const runScope = scopesByObject();

/** The tool's JSON schema with the model's optional, nullable `idempotency_key` (in strict mode
 * every property is required, so it is listed there, and the model sends null for none). */
function withKeyParameter(parameters, strict) {
  return {
    ...parameters,
    properties: { ...(parameters.properties ?? {}), [KEY_ARGUMENT]: keyProperty() },
    required: strict ? [...(parameters.required ?? []), KEY_ARGUMENT] : parameters.required ?? [],
  };
}

/** `fnTool` (a `FunctionTool`) run through `engine` under its name, once per action (the rules
 * of `idemgate/ai`'s `idempotentTool`): the same `callId` answers the stored result; an identical
 * call re-emitted under a new id in the conversation within the window is not run again and the
 * model reads that it already ran; another conversation, or the model's `idempotency_key`, is
 * another action; an answer that did not run the tool now says so in words.
 * `scope(input, runContext)` (or a string) names the conversation (default:
 * `runContext.context?.conversationId`, else the run: `runScope`); `key(input, runContext)` names
 * the action by its business identity. */
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
        defaultScope: () => runContext?.context?.conversationId ?? runScope(runContext),
        signal: details?.signal,
        policy,
      }, (args) => fnTool.invoke(runContext, JSON.stringify(injected ? args : parsed), details));
    },
  };
}

module.exports = { idempotentFunctionTool };
