'use strict';
// The LangChain.js adapter's body (`idemgate/langchain`): a LangChain tool whose calls run once
// per action, keyed by the tool call's id within the conversation (the graph's `thread_id`).
// Built with the caller's zod and `@langchain/core/tools` (the ESM entry gives the ESM ones, the
// CommonJS entry the CommonJS ones), so the schema it extends and LangChain read one zod.
const { KEY_ARGUMENT, KEY_DESCRIPTION, policyFields, toolCall } = require('./tool-calls.cjs');

function makeLangChain(z, tool) {
  /** `schema` (a zod object or a JSON schema) with the model's optional `idempotency_key`. */
  function withKeyArgument(schema) {
    if (schema && typeof schema.extend === 'function') {
      return schema.extend({ [KEY_ARGUMENT]: z.string().optional().describe(KEY_DESCRIPTION) });
    }
    return {
      ...schema,
      properties: { ...(schema?.properties ?? {}), [KEY_ARGUMENT]: { type: 'string', description: KEY_DESCRIPTION } },
    };
  }

  /** `inner` (a LangChain structured tool) as a tool of the same name and description whose
   * calls run through `engine` once per action (the rules of `idemgate/ai`'s `idempotentTool`),
   * keyed by the tool call's id (`config.toolCall.id`, as a ToolNode invokes tools) within the
   * conversation: `scope(input, config)` or a string, default `config.configurable.thread_id`.
   * `key(input, config)` names the action by its business identity. */
  return function idempotentLangChainTool(engine, inner, options = {}) {
    const name = inner.name;
    const policy = policyFields(options);
    engine.policy(name, policy);
    return tool(
      (input, config) =>
        toolCall(engine, name, input, config, options, {
          callId: config?.toolCall?.id,
          defaultScope: config?.configurable?.thread_id,
          signal: config?.signal,
          policy,
        }, (args) => inner.invoke(args, { configurable: config?.configurable, signal: config?.signal })),
      { name, description: inner.description, schema: options.modelKey === false ? inner.schema : withKeyArgument(inner.schema) },
    );
  };
}

module.exports = { makeLangChain };
