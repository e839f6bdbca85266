'use strict';
// The LangChain.js adapter's body (`idemgate/langchain`): a LangChain tool whose calls run once
// per action, keyed by the tool call's id within the conversation (the graph's `thread_id`).
// Built with the caller's zod and `@langchain/core/tools` (the ESM entry gives the ESM ones, the
// CommonJS entry the CommonJS ones), so the schema it extends and LangChain read one zod.
const {
  KEY_ARGUMENT, isRefusal, keyProperty, policyFields, refusalText, toolCall, zodKeyArgument,
} = require('./tool-calls.cjs');

/** The conversation a LangChain call names: LangGraph's `configurable.thread_id`, else the keys
 * LangSmith groups a conversation's runs by (`metadata.thread_id`, `session_id`,
 * `conversation_id`). A tool is handed no run of its own (no run id without callbacks), so a
 * call that names none is its own invocation (`nameAction`). */
function conversationOf(config) {
  const m = config?.metadata ?? {};
  return config?.configurable?.thread_id ?? m.thread_id ?? m.session_id ?? m.conversation_id ?? null;
}

/** `zod` is `{ z3, z4 }`: the caller's `zod/v3` and `zod/v4`; `tool` and `ToolMessage` are the
 * caller's `@langchain/core`'s. */
function makeLangChain({ z3, z4 }, tool, ToolMessage) {
  /** `schema` (a zod 3 or zod 4 object, or a JSON schema) with the model's optional, nullable
   * `idempotency_key`, built by the schema's own zod (a zod 4 member in a zod 3 object would not
   * convert) with a description every JSON schema converter LangChain uses reads
   * (`zodKeyArgument`). */
  function withKeyArgument(schema) {
    if (schema && typeof schema.extend === 'function') {
      return schema.extend({ [KEY_ARGUMENT]: zodKeyArgument(schema._zod !== undefined ? z4 : z3) });
    }
    return {
      ...schema,
      properties: { ...(schema?.properties ?? {}), [KEY_ARGUMENT]: keyProperty() },
    };
  }

  /** `inner` (a LangChain structured tool) as a tool of the same name and description whose
   * calls run through `engine` once per action (the rules of `idemgate/ai`'s `idempotentTool`),
   * keyed by the tool call's id (`config.toolCall.id`, as a ToolNode invokes tools) within the
   * conversation: `scope(input, config)` or a string, default `conversationOf(config)`, else the
   * call's own invocation. `key(input, config)` names the action by its business identity. An
   * answer that did not run `inner` now says so in words.
   *
   * A refusal (`OutcomeExpired` for a retry after the ttl, `OutcomeUnknown`, `InFlight`,
   * `KeyReused`...) of a model's tool call answers it with a ToolMessage of status `error`
   * (what a ToolNode makes of a tool's error), whose content is the kit's words for a model
   * (`idemgate: …`) and whose `artifact` (never sent to the model) is the error itself, for the
   * program. Invoked with plain arguments (no tool call: the program is the caller), it throws. */
  return function idempotentLangChainTool(engine, inner, options = {}) {
    const name = inner.name;
    const policy = policyFields(options);
    engine.policy(name, policy);
    return tool(
      (input, config) =>
        toolCall(engine, name, input, config, options, {
          callId: config?.toolCall?.id,
          defaultScope: () => conversationOf(config),
          signal: config?.signal,
          policy,
        // `inner` runs without the caller's signal: LangChain would reject its invoke at the
        // abort while its function goes on, leaving the outcome unknown; the signal stops the
        // caller's wait only, and the call's outcome is recorded for its retry.
        }, (args) => inner.invoke(args, { configurable: config?.configurable })).catch((e) => {
          const id = config?.toolCall?.id;
          if (!isRefusal(e) || id == null) throw e;
          return new ToolMessage({ status: 'error', content: refusalText(e), artifact: e, tool_call_id: id, name });
        }),
      { name, description: inner.description, schema: options.modelKey === false ? inner.schema : withKeyArgument(inner.schema) },
    );
  };
}

module.exports = { makeLangChain };
