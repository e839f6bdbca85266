// The Vercel AI SDK adapter, driven by the SDK's own generateText and its mock model: the three
// ways a tool call comes back (the same call id re-sent, the identical call re-emitted under a
// new id, the model repeating the action on purpose), conversations kept apart with the
// adapter's default options (the SDK names no conversation), and no replay without words.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, isStepCount, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import { Engine, OutcomeExpired } from '../index.mjs';
import { idempotentTool } from '../ai.mjs';
import { deferred, settled, unique, within } from './helpers.mjs';

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

/** A model step that calls `send_email` with `input` under `toolCallId`. */
const callStep = (toolCallId, input) => ({
  content: [{ type: 'tool-call', toolCallId, toolName: 'send_email', input: JSON.stringify(input) }],
  finishReason: { unified: 'tool-calls', raw: undefined },
  usage,
  warnings: [],
});
const doneStep = () => ({ content: [{ type: 'text', text: 'done' }], finishReason: { unified: 'stop', raw: undefined }, usage, warnings: [] });

/** A model that answers with one call of `send_email` with `input` under `toolCallId`. */
function modelCalling(toolCallId, input) {
  return new MockLanguageModelV4({ doGenerate: async () => callStep(toolCallId, input) });
}

/** An agent with a mail tool that counts the mails it really sends. */
async function agent(options = {}) {
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
  const tools = { send_email: idempotentTool(engine, 'send_email', sendEmail, options) };
  /** One model turn of `conversation` (a scope the program names): the tool's output. */
  const turn = async (conversation, toolCallId, input) => {
    const scoped = { send_email: idempotentTool(engine, 'send_email', sendEmail, { ...options, scope: conversation }) };
    const r = await generateText({ model: modelCalling(toolCallId, input), tools: scoped, prompt: 'mail Ann' });
    assert.equal(r.toolResults.length, 1, JSON.stringify(r.content));
    return r.toolResults[0].output;
  };
  return { engine, sent, turn, tools };
}

const MAIL = { to: 'ann@example.com', subject: 'invoice' };
const TOLD_DONE = /idemgate: this action was already performed at .* and was not repeated/;

test('the same tool-call id re-sent in a conversation sends one mail and answers its result, saying so', async () => {
  const { sent, turn } = await agent();
  const first = await turn('conv-1', 'call-1', MAIL);
  const again = await turn('conv-1', 'call-1', MAIL);
  assert.equal(sent.length, 1);
  assert.deepEqual(first, { messageId: 'm-1', to: MAIL.to });
  // Was: `again` deep-equal to `first`, a replay without a word (never silent).
  assert.ok(again.startsWith(JSON.stringify(first)), again);
  assert.match(again, TOLD_DONE);
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
  // Was: `again` deep-equal to `repeat`, silently: the model reusing its key for a new action
  // would believe it had sent a third mail.
  assert.ok(again.startsWith(JSON.stringify(repeat)), again);
  assert.match(again, TOLD_DONE);
});

test('default options: a constant call id in two conversations (the same words) sends two mails', async () => {
  const { sent, tools } = await agent();
  for (const n of [1, 2]) {
    const r = await generateText({ model: modelCalling('call_0', MAIL), tools, prompt: 'mail Ann' });
    assert.deepEqual(r.toolResults[0].output, { messageId: `m-${n}`, to: MAIL.to });
  }
  assert.equal(sent.length, 2);
});

test('default options: the identical call re-emitted after a tool timeout in one conversation sends one mail, and the model is told', async () => {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  const release = deferred();
  const slow = tool({
    inputSchema: z.object({ to: z.string(), subject: z.string() }),
    execute: async ({ to }) => {
      sent.push(to);
      await release.promise; // still sending when the SDK gives up on it
      return `sent m-${sent.length} to ${to}`;
    },
  });
  const steps = [
    async () => callStep('call-1', MAIL),
    async () => {
      // The SDK timed call-1 out (its result is an error); the mail went out all the same. The
      // model re-emits the call under a new id once the first call has ended.
      release.resolve();
      await settled(engine);
      return callStep('call-2', MAIL);
    },
    async () => doneStep(),
  ];
  let i = 0;
  const model = new MockLanguageModelV4({ doGenerate: () => steps[i++]() });
  // `within` keeps the event loop alive (the SDK's timeout timer does not).
  const r = await within(generateText({
    model,
    tools: { send_email: idempotentTool(engine, 'send_email', slow) },
    prompt: 'mail Ann',
    timeout: { toolMs: 50 },
    stopWhen: isStepCount(3),
  }), 'the conversation');
  const [timedOut, reemitted] = r.steps.flatMap((s) => s.content.filter((p) => p.type === 'tool-error' || p.type === 'tool-result'));
  assert.equal(timedOut.type, 'tool-error', JSON.stringify(timedOut));
  assert.equal(sent.length, 1);
  assert.equal(reemitted.type, 'tool-result');
  assert.ok(reemitted.output.startsWith('"sent m-1 to ann@example.com"'), reemitted.output);
  assert.match(reemitted.output, /an identical call of this tool .* was not run again/);
});

test('default options: a later turn of the conversation that reuses a call id for a new action is told it was not repeated', async () => {
  const { sent, tools } = await agent();
  const messages = [{ role: 'user', content: 'mail Ann the invoice' }];
  const first = await generateText({ model: modelCalling('call_0', MAIL), tools, messages });
  messages.push(...first.response.messages, { role: 'user', content: 'and once more, please' });
  const later = await generateText({ model: modelCalling('call_0', MAIL), tools, messages });
  const output = later.toolResults[0].output;
  assert.equal(sent.length, 1);
  assert.match(output, TOLD_DONE);
});

test('the model is shown the optional, nullable idempotency_key argument, and null is no key', async () => {
  const { sent, tools } = await agent();
  let seen;
  const model = new MockLanguageModelV4({
    doGenerate: async (options) => {
      seen = options.tools;
      return callStep('call-1', { ...MAIL, idempotency_key: null });
    },
  });
  await generateText({ model, tools, prompt: 'x' });
  const schema = seen.find((d) => d.name === 'send_email').inputSchema;
  assert.deepEqual(schema.required, ['to', 'subject']);
  assert.deepEqual(schema.properties.idempotency_key.type, ['string', 'null']);
  assert.match(schema.properties.idempotency_key.description, /^Leave empty\. .*do an action again on purpose/);
  assert.equal(sent.length, 1);
});

test('a retry after the ttl is not run: the model reads that it expired, the program gets OutcomeExpired as the tool-error', async () => {
  const { sent, tools } = await agent({ ttl: 0.3 });
  const messages = [{ role: 'user', content: 'mail Ann the invoice' }];
  const first = await generateText({ model: modelCalling('call-1', MAIL), tools, messages });
  messages.push(...first.response.messages);
  await new Promise((resolve) => setTimeout(resolve, 700));
  // The turn retried past the ttl: the same call again; the model's next step reads the answer.
  let read;
  const steps = [async () => callStep('call-1', MAIL), async ({ prompt }) => {
    read = prompt.at(-1).content[0].output;
    return doneStep();
  }];
  let i = 0;
  const r = await generateText({ model: new MockLanguageModelV4({ doGenerate: (o) => steps[i++](o) }), tools, messages, stopWhen: isStepCount(2) });
  assert.equal(sent.length, 1);
  const [error] = r.steps.flatMap((s) => s.content.filter((p) => p.type === 'tool-error'));
  assert.ok(error?.error instanceof OutcomeExpired, JSON.stringify(r.steps.map((s) => s.content)));
  assert.equal(error.error.verdict, 'expired');
  assert.equal(typeof error.error.fence, 'number');
  assert.match(error.error.message, /already ran at .* so it was not run now/, 'its message is for a person');
  assert.equal(read.type, 'error-text');
  assert.equal(read.value, `idemgate: ${error.error.forModel}`);
  assert.match(read.value, /^idemgate: This action was already performed at .*, and its result is no longer kept .*NOT performed again.*idempotency_key set to a new value/);
});
