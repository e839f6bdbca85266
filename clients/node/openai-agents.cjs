'use strict';
// The OpenAI Agents SDK for JS adapter (`import { idempotentFunctionTool } from
// 'idemgate/openai-agents'`): a function tool (what `tool({...})` returns) whose calls run once
// per action, keyed by the call's `callId` within the conversation.
const {
  KEY_ARGUMENT, isRefusal, keyProperty, policyFields, refusalText, scopesByObject, toolCall,
} = require('./tool-calls.cjs');

/** What the model reads for an idemgate refusal when the program passes no `errorFunction`: the
 * kit's words for a model (`idemgate: …`). */
const refusalForModel = (runContext, error) => refusalText(error);

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
 * the action by its business identity.
 *
 * A refusal (`OutcomeExpired` for a retry after the ttl, `OutcomeUnknown`, `InFlight`,
 * `KeyReused`...) does not end the run: it goes where the SDK hands a function tool's errors,
 * `errorFunction(runContext, error, details)` (the option of the SDK's `tool()`), and the model
 * reads what that returns; default: the kit's words for a model (`idemgate: …`). A program that
 * wants the error passes its own (to log it, or to throw it: the run then fails with it). */
function idempotentFunctionTool(engine, fnTool, options = {}) {
  const name = fnTool.name;
  const policy = policyFields(options);
  engine.policy(name, policy);
  const declared = KEY_ARGUMENT in (fnTool.parameters?.properties ?? {});
  const injected = options.modelKey !== false && !declared;
  return {
    ...fnTool,
    parameters: injected ? withKeyParameter(fnTool.parameters, fnTool.strict) : fnTool.parameters,
    invoke: async (runContext, input, details) => {
      const parsed = JSON.parse(input || '{}');
      try {
        return await toolCall(engine, name, parsed, runContext, options, {
          callId: details?.toolCall?.callId,
          defaultScope: () => runContext?.context?.conversationId ?? runScope(runContext),
          signal: details?.signal,
          policy,
        }, (args) => fnTool.invoke(runContext, JSON.stringify(injected ? args : parsed), details));
      } catch (e) {
        if (!isRefusal(e)) throw e;
        return (options.errorFunction ?? refusalForModel)(runContext, e, details);
      }
    },
  };
}

module.exports = { idempotentFunctionTool };
