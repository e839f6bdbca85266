// The OpenAI Agents SDK for JS adapter, driven by the SDK's own run loop with a scripted model:
// the three ways a tool call comes back, conversations (runs, with the adapter's default
// options) kept apart, and no replay without words.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Agent, Runner, tool, Usage, setTracingDisabled } from '@openai/agents-core';
import { z } from 'zod';
import { Engine, OutcomeExpired } from '../index.mjs';
import { idempotentFunctionTool } from '../openai-agents.mjs';
import { deferred, settled, unique, within } from './helpers.mjs';

setTracingDisabled(true);

const callOf = (callId, input) =>
  ({ type: 'function_call', callId, name: 'send_email', arguments: JSON.stringify(input), status: 'completed' });
const done = { type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'done' }] };

/** A model whose turns are `turns` (each a function of nothing to the turn's output items,
 * possibly async), then says it is done. */
function scripted(turns) {
  let i = 0;
  return {
    async getResponse() {
      const output = i < turns.length ? await turns[i++]() : [done];
      return { usage: new Usage(), output };
    },
    async *getStreamedResponse() {
      throw new Error('not streamed');
    },
  };
}

/** A model that calls `send_email` with `input` under `callId`, then says it is done. */
const modelCalling = (callId, input) => scripted([() => [callOf(callId, input)]]);

async function agent() {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  const sendEmail = tool({
    name: 'send_email',
    description: 'Send an email',
    parameters: z.object({ to: z.string(), subject: z.string() }),
    execute: async ({ to, subject }) => {
      sent.push({ to, subject });
      return `sent m-${sent.length} to ${to}`;
    },
  });
  const runner = new Runner();
  /** The tool outputs of one run of `model` with `wrapped`. */
  const outputsOf = async (wrapped, model) => {
    const a = new Agent({ name: 'mailer', instructions: 'mail', tools: [wrapped], model });
    const result = await within(runner.run(a, 'mail Ann'), 'the run');
    return result.newItems.filter((i) => i.type === 'tool_call_output_item').map((i) => i.output);
  };
  /** One run of `conversation` in which the model calls the tool once: the tool's output. */
  const turn = async (conversation, callId, input) => {
    const outputs = await outputsOf(idempotentFunctionTool(engine, sendEmail, { scope: conversation }), modelCalling(callId, input));
    assert.equal(outputs.length, 1);
    return outputs[0];
  };
  return { sent, turn, sendEmail, engine, outputsOf };
}

const MAIL = { to: 'ann@example.com', subject: 'invoice' };
const TOLD_DONE = /idemgate: this action was already performed at .* and was not repeated/;

test('the same call id re-sent in a conversation sends one mail and answers its result, saying so', async () => {
  const { sent, turn } = await agent();
  assert.equal(await turn('conv-1', 'call-1', MAIL), 'sent m-1 to ann@example.com');
  // Was: the bare 'sent m-1 to ann@example.com' again, a replay without a word.
  const again = await turn('conv-1', 'call-1', MAIL);
  assert.ok(again.startsWith('"sent m-1 to ann@example.com"'), again);
  assert.match(again, TOLD_DONE);
  assert.equal(sent.length, 1);
});

test('the identical call re-emitted under a new id sends one mail and tells the model it already ran', async () => {
  const { sent, turn } = await agent();
  await turn('conv-1', 'call-1', MAIL);
  const reemitted = await turn('conv-1', 'call-2', MAIL);
  assert.equal(sent.length, 1);
  assert.ok(reemitted.startsWith('"sent m-1 to ann@example.com"'), reemitted);
  assert.match(reemitted, /an identical call of this tool .* was not run again/);
});

test('the same call in two conversations sends two mails', async () => {
  const { sent, turn } = await agent();
  await turn('conv-1', 'call-1', MAIL);
  assert.equal(await turn('conv-2', 'call-1', MAIL), 'sent m-2 to ann@example.com');
  assert.equal(sent.length, 2);
});

test('the model repeating the action with idempotency_key sends a second mail; reusing that key later is told', async () => {
  const { sent, turn, sendEmail, engine } = await agent();
  await turn('conv-1', 'call-1', { ...MAIL, idempotency_key: null });
  assert.equal(await turn('conv-1', 'call-2', { ...MAIL, idempotency_key: 'second-reminder' }), 'sent m-2 to ann@example.com');
  assert.deepEqual(sent[1], MAIL, 'the tool gets its own arguments, without the model key');
  assert.equal(sent.length, 2);
  assert.match(await turn('conv-1', 'call-3', { ...MAIL, idempotency_key: 'second-reminder' }), TOLD_DONE);
  assert.equal(sent.length, 2);
  const schema = idempotentFunctionTool(engine, sendEmail).parameters;
  assert.match(schema.properties.idempotency_key.description, /^Leave empty\. .*do an action again on purpose/);
  assert.deepEqual(schema.properties.idempotency_key.type, ['string', 'null']);
  assert.ok(schema.required.includes('idempotency_key'), 'strict mode lists every property (null is none)');
});

test('default options: a constant call id in two runs sends two mails', async () => {
  const { sent, sendEmail, engine, outputsOf } = await agent();
  const wrapped = idempotentFunctionTool(engine, sendEmail);
  assert.deepEqual(await outputsOf(wrapped, modelCalling('call_0', MAIL)), ['sent m-1 to ann@example.com']);
  assert.deepEqual(await outputsOf(wrapped, modelCalling('call_0', MAIL)), ['sent m-2 to ann@example.com']);
  assert.equal(sent.length, 2);
});

test('default options: the identical call re-emitted after the tool timed out in the run sends one mail, and the model is told', async () => {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  const release = deferred();
  const slow = tool({
    name: 'send_email',
    description: 'Send an email',
    parameters: z.object({ to: z.string(), subject: z.string() }),
    timeoutMs: 50,
    execute: async ({ to }) => {
      sent.push(to);
      await release.promise; // still sending when the SDK gives up on it
      return `sent m-${sent.length} to ${to}`;
    },
  });
  const model = scripted([
    () => [callOf('call-1', MAIL)],
    async () => {
      // The SDK told the model call-1 timed out; the mail went out all the same. The model
      // re-emits the call under a new id once the first call has ended.
      release.resolve();
      await settled(engine);
      return [callOf('call-2', MAIL)];
    },
  ]);
  const a = new Agent({ name: 'mailer', instructions: 'mail', tools: [idempotentFunctionTool(engine, slow)], model });
  const result = await within(new Runner().run(a, 'mail Ann'), 'the run');
  const [timedOut, reemitted] = result.newItems.filter((i) => i.type === 'tool_call_output_item').map((i) => i.output);
  assert.match(timedOut, /timed out/);
  assert.equal(sent.length, 1);
  assert.ok(reemitted.startsWith('"sent m-1 to ann@example.com"'), reemitted);
  assert.match(reemitted, /an identical call of this tool .* was not run again/);
});

test('a retry after the ttl is not run: the model reads that it expired; errorFunction gets OutcomeExpired', async () => {
  const { sent, sendEmail, engine } = await agent();
  const got = [];
  const conversation = unique('conversation');
  const tools = [
    idempotentFunctionTool(engine, sendEmail, { ttl: 0.3 }),
    idempotentFunctionTool(engine, sendEmail, {
      ttl: 0.3,
      errorFunction: (runContext, error) => {
        got.push(error);
        return `refused: ${error.verdict}`;
      },
    }),
  ];
  const run = async (wrapped) => {
    const a = new Agent({ name: 'mailer', instructions: 'mail', tools: [wrapped], model: modelCalling('call-1', MAIL) });
    const result = await within(new Runner().run(a, 'mail Ann', { context: { conversationId: conversation } }), 'the run');
    return result.newItems.filter((i) => i.type === 'tool_call_output_item').map((i) => i.output);
  };
  assert.deepEqual(await run(tools[0]), ['sent m-1 to ann@example.com']);
  await new Promise((resolve) => setTimeout(resolve, 700));
  // The conversation's later run re-sends the call: not run, and the run goes on.
  const [told] = await run(tools[0]);
  assert.match(told, /^idemgate: This action was already performed at .*, and its result is no longer kept .*NOT performed again.*idempotency_key set to a new value/);
  // The program's errorFunction gets the error; the model reads what it returns.
  assert.deepEqual(await run(tools[1]), ['refused: expired']);
  assert.equal(got.length, 1);
  assert.ok(got[0] instanceof OutcomeExpired, String(got[0]));
  assert.equal(told, `idemgate: ${got[0].forModel}`);
  assert.equal(sent.length, 1);
});
