'use strict';
// The Vercel AI SDK adapter (`import { idempotentTool } from 'idemgate/ai'`): a `tool()` whose
// `execute` runs once per action, keyed by the call's `toolCallId` within the conversation.
const {
  KEY_ARGUMENT, freshScope, isRefusal, keyProperty, policyFields, splitModelKey, toldToModel, toolCall,
} = require('./tool-calls.cjs');

/** The scopes of conversations the SDK hands over only as message objects, by message. */
const conversations = new WeakMap();

/** The conversation of a call whose program names none, told by the message objects the SDK
 * hands `execute` (`options.messages`: the prompt's messages, then each step's responses). The
 * SDK passes on the caller's own objects: the same ones in every later step of one
 * generateText/streamText call, and again in later calls to which the program passes the history
 * (`[...messages, ...response.messages, next]`). It names no conversation, and words say nothing
 * (two users may both write "mail Ann"), so a conversation is named by object identity: the
 * scope of the first message that has one, else a fresh scope given to the newest message (the
 * one this call answers; not the first, which conversations may share, as few-shot examples).
 * Two calls share a scope only when they share a message object: a later
 * step or turn of the same conversation, or a branch of it (a regenerated answer), never another
 * conversation (a `prompt` string is a fresh message in every call). A program that puts one
 * message object into unrelated conversations (a constant kick-off message) names them alike:
 * it passes `scope` instead. */
function conversationOf(messages) {
  if (!Array.isArray(messages) || messages.length === 0) return null;
  for (const m of messages) {
    const s = m !== null && typeof m === 'object' ? conversations.get(m) : undefined;
    if (s !== undefined) return s;
  }
  const newest = messages[messages.length - 1];
  if (newest === null || typeof newest !== 'object') return null;
  const s = freshScope();
  conversations.set(newest, s);
  return s;
}

/** `schema` (any schema the SDK takes: zod, `jsonSchema()`, Standard Schema) with an optional,
 * nullable `idempotency_key` argument described to the model: its JSON schema gains the
 * property, and a call's input is validated by `schema` without it (then given back to the
 * adapter with it). */
function withKeyArgument(schema) {
  const { asSchema, jsonSchema } = require('ai');
  const inner = asSchema(schema);
  return jsonSchema(
    async () => {
      const js = await inner.jsonSchema;
      return {
        ...js,
        properties: { ...(js.properties ?? {}), [KEY_ARGUMENT]: keyProperty() },
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
 *   `modelKey: false`), is another action;
 * - every answer that did not run `execute` now says so to the model in words: a replay as the
 *   stored result and a notice; a refusal (`OutcomeExpired` for a retry after the ttl,
 *   `OutcomeUnknown`, `InFlight`, `KeyReused`...) is thrown, so the program finds the error in
 *   the call's `tool-error` part, and the SDK sends the model its text, which is the kit's words
 *   for a model (`idemgate: …`, `toldToModel`).
 * `scope(input, options)` (or a string) names the conversation; default: the tool's context's
 * `conversationId`, else the conversation told by its message objects (`conversationOf`).
 * `key(input, options)` names the action by its business identity instead.
 * The call's `abortSignal` stops the wait, never the recording. The policy fields (`ttl`,
 * `lease`, `wait`, `window`, `onUnknown`, `kind`, `tombstone`) override the engine's for the
 * tool. */
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
        defaultScope: () => opts.context?.conversationId ?? conversationOf(opts.messages),
        signal: opts.abortSignal,
        policy,
      }, (args) => execute(args, opts)).catch((e) => {
        // The SDK records the error as the call's `tool-error` (the program's) and sends the
        // model `String(error)`: the words for a model.
        throw isRefusal(e) ? toldToModel(e) : e;
      }),
  };
}

module.exports = { idempotentTool, withKeyArgument };
