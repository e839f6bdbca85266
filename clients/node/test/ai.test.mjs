// The Vercel AI SDK adapter, driven by the SDK's own generateText and its mock model: the three
// ways a tool call comes back (the same call id re-sent, the identical call re-emitted under a
// new id, the model repeating the action on purpose) and conversations kept apart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import { Engine } from '../index.mjs';
import { idempotentTool } from '../ai.mjs';
import { unique } from './helpers.mjs';

/** A model that answers with one call of `send_email` with `input` under `toolCallId`. */
function modelCalling(toolCallId, input) {
  return new MockLanguageModelV4({
    doGenerate: async () => ({
      content: [{ type: 'tool-call', toolCallId, toolName: 'send_email', input: JSON.stringify(input) }],
      finishReason: { unified: 'tool-calls', raw: undefined },
      usage: {
        inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
        outputTokens: { total: 5, text: 5, reasoning: undefined },
      },
      warnings: [],
    }),
  });
}

/** An agent with a mail tool that counts the mails it really sends. */
async function agent() {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  const sendEmail = tool({
    description: 'Send an email',
    inputSchema: z.object({ to: z.string(), subject: z.string() }),
    execute: async ({ to, subject }) => {
      sent.push({ to, subject });
      return { messageId: `m-${sent.length}`, to };
    },
  });
  /** One model turn of `conversation`: the tool's output. */
  const turn = async (conversation, toolCallId, input) => {
    const tools = { send_email: idempotentTool(engine, 'send_email', sendEmail, { scope: conversation }) };
    const r = await generateText({ model: modelCalling(toolCallId, input), tools, prompt: 'mail Ann' });
    assert.equal(r.toolResults.length, 1, JSON.stringify(r.content));
    return r.toolResults[0].output;
  };
  return { engine, sent, turn };
}

const MAIL = { to: 'ann@example.com', subject: 'invoice' };

test('the same tool-call id re-sent in a conversation sends one mail and answers its result', async () => {
  const { sent, turn } = await agent();
  const first = await turn('conv-1', 'call-1', MAIL);
  const again = await turn('conv-1', 'call-1', MAIL);
  assert.equal(sent.length, 1);
  assert.deepEqual(first, { messageId: 'm-1', to: MAIL.to });
  assert.deepEqual(again, first);
});

test('the identical call re-emitted under a new id sends one mail and tells the model it already ran', async () => {
  const { sent, turn } = await agent();
  await turn('conv-1', 'call-1', MAIL);
  const reemitted = await turn('conv-1', 'call-2', MAIL);
  assert.equal(sent.length, 1);
  assert.equal(typeof reemitted, 'string');
  assert.ok(reemitted.startsWith(JSON.stringify({ messageId: 'm-1', to: MAIL.to })), reemitted);
  assert.match(reemitted, /an identical call of this tool \(the same arguments, without an idempotency key\) ran at .* was not run again/);
  assert.match(reemitted, /idempotency_key set to a new value/);
});

test('the same call in two conversations sends two mails', async () => {
  const { sent, turn } = await agent();
  await turn('conv-1', 'call-1', MAIL);
  const other = await turn('conv-2', 'call-1', MAIL);
  assert.equal(sent.length, 2);
  assert.deepEqual(other, { messageId: 'm-2', to: MAIL.to });
});

test('the model repeating the action on purpose with idempotency_key sends a second mail', async () => {
  const { sent, turn } = await agent();
  await turn('conv-1', 'call-1', MAIL);
  const repeat = await turn('conv-1', 'call-2', { ...MAIL, idempotency_key: 'second-reminder' });
  assert.equal(sent.length, 2);
  assert.deepEqual(sent[1], MAIL, 'the tool gets its own arguments, without the model key');
  assert.deepEqual(repeat, { messageId: 'm-2', to: MAIL.to });
  const again = await turn('conv-1', 'call-3', { ...MAIL, idempotency_key: 'second-reminder' });
  assert.equal(sent.length, 2, 'the same model key is the same action');
  assert.deepEqual(again, repeat);
});

test('the model is shown the optional idempotency_key argument', async () => {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  let seen;
  const model = new MockLanguageModelV4({
    doGenerate: async (options) => {
      seen = options.tools;
      return {
        content: [{ type: 'text', text: 'ok' }],
        finishReason: { unified: 'stop', raw: undefined },
        usage: {
          inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
          outputTokens: { total: 1, text: 1, reasoning: undefined },
        },
        warnings: [],
      };
    },
  });
  const t = tool({ inputSchema: z.object({ to: z.string() }), execute: async () => 'sent' });
  await generateText({ model, tools: { send_email: idempotentTool(engine, 'send_email', t, { scope: 'c' }) }, prompt: 'x' });
  const schema = seen.find((d) => d.name === 'send_email').inputSchema;
  assert.deepEqual(schema.required, ['to']);
  assert.match(schema.properties.idempotency_key.description, /do an action again on purpose/);
});
