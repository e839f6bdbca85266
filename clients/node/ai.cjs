'use strict';
// The Vercel AI SDK adapter (`import { idempotentTool } from 'idemgate/ai'`): a `tool()` whose
// `execute` runs once per action, keyed by the call's `toolCallId` within the conversation.
const { KEY_ARGUMENT, KEY_DESCRIPTION, policyFields, splitModelKey, toolCall } = require('./tool-calls.cjs');

/** `schema` (any schema the SDK takes: zod, `jsonSchema()`, Standard Schema) with an optional
 * `idempotency_key` argument described to the model: its JSON schema gains the property, and a
 * call's input is validated by `schema` without it (then given back to the adapter with it). */
function withKeyArgument(schema) {
  const { asSchema, jsonSchema } = require('ai');
  const inner = asSchema(schema);
  return jsonSchema(
    async () => {
      const js = await inner.jsonSchema;
      return {
        ...js,
        properties: { ...(js.properties ?? {}), [KEY_ARGUMENT]: { type: 'string', description: KEY_DESCRIPTION } },
      };
    },
    {
      validate: async (value) => {
        const [given, rest] = splitModelKey(value, true);
        const checked = inner.validate ? await inner.validate(rest) : { success: true, value: rest };
        if (!checked.success || given === null) return checked;
        return { success: true, value: { ...checked.value, [KEY_ARGUMENT]: given } };
      },
    },
  );
}

/** The AI SDK tool `def` (what `tool({...})` returns), its `execute` run through `engine` under
 * the tool name `name`, once per action:
 * - the same `toolCallId` re-sent in the conversation answers the stored result;
 * - an identical call (same arguments) re-emitted under a new id in the conversation within the
 *   window (`window`, default 60 s) is not run again, and the model reads that it already ran;
 * - another conversation, or the model's `idempotency_key` argument (added to the schema unless
 *   `modelKey: false`), is another action.
 * `scope(input, options)` (or a string) names the conversation (default: `options.context
 * ?.conversationId`); `key(input, options)` names the action by its business identity instead.
 * The call's `abortSignal` stops the wait, never the recording. The policy fields (`ttl`,
 * `lease`, `wait`, `window`, `onUnknown`, `kind`) override the engine's for the tool. */
function idempotentTool(engine, name, def, options = {}) {
  const policy = policyFields(options);
  engine.policy(name, policy);
  const execute = def.execute;
  if (typeof execute !== 'function') throw new TypeError(`idempotentTool: the tool ${name} has no execute`);
  return {
    ...def,
    inputSchema: options.modelKey === false ? def.inputSchema : withKeyArgument(def.inputSchema),
    execute: (input, opts = {}) =>
      toolCall(engine, name, input, opts, options, {
        callId: opts.toolCallId,
        defaultScope: opts.context?.conversationId,
        signal: opts.abortSignal,
        policy,
      }, (args) => execute(args, opts)),
  };
}

module.exports = { idempotentTool, withKeyArgument };
