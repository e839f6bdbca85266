// The LangChain.js adapter, driven by LangChain's own fake chat model and its tool loop (the
// model's AIMessage tool calls invoked as a ToolNode invokes them: a ToolCall in, a ToolMessage
// out, the conversation as `configurable.thread_id`): the three ways a tool call comes back,
// conversations kept apart with the adapter's default options, no replay without words, and the
// model's key argument described under every schema library the adapter takes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { tool } from '@langchain/core/tools';
import { FakeStreamingChatModel } from '@langchain/core/utils/testing';
import { z } from 'zod';
import { z as z3 } from 'zod/v3';
import { Engine, OutcomeExpired } from '../index.mjs';
import { idempotentLangChainTool } from '../langchain.mjs';
import { deferred, settled, unique, within } from './helpers.mjs';

const MAIL = { to: 'ann@example.com', subject: 'invoice' };
const TOLD_DONE = /idemgate: this action was already performed at .* and was not repeated/;

/** The fake chat model, bound to `tools`, whose answer calls `send_email` with `args` under `id`. */
const modelCalling = (tools, id, args) =>
  new FakeStreamingChatModel({ chunks: [{ content: '', tool_calls: [{ name: 'send_email', args, id, type: 'tool_call' }] }] }).bindTools(tools);

async function agent(schema = z.object({ to: z.string(), subject: z.string() })) {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  const release = { promise: null };
  const sendEmail = tool(async ({ to, subject }) => {
    sent.push({ to, subject });
    await release.promise;
    return `sent m-${sent.length} to ${to}`;
  }, { name: 'send_email', description: 'Send an email', schema });
  const wrapped = idempotentLangChainTool(engine, sendEmail);
  /** One turn of the loop: the model's tool call under `id` with `args`, invoked with `config`
   * (the graph's), and the ToolMessage's content. */
  const call = async (id, args, config = {}) => {
    const ai = await modelCalling([wrapped], id, args).invoke([['human', 'mail Ann']]);
    const message = await within(wrapped.invoke(ai.tool_calls[0], config), 'the tool call');
    assert.equal(message.tool_call_id, id);
    return message.content;
  };
  const turn = (thread, id, args) => call(id, args, { configurable: { thread_id: thread } });
  return { engine, sent, call, turn, wrapped, release };
}

test('the same tool call id re-sent in a thread sends one mail and answers its result, saying so', async () => {
  const { sent, turn } = await agent();
  assert.equal(await turn('thread-1', 'call-1', MAIL), 'sent m-1 to ann@example.com');
  // Was: the bare 'sent m-1 to ann@example.com' again, a replay without a word.
  const again = await turn('thread-1', 'call-1', MAIL);
  assert.ok(again.startsWith('"sent m-1 to ann@example.com"'), again);
  assert.match(again, TOLD_DONE);
  assert.equal(sent.length, 1);
});

test('the identical call re-emitted under a new id sends one mail and tells the model it already ran', async () => {
  const { sent, turn } = await agent();
  await turn('thread-1', 'call-1', MAIL);
  const reemitted = await turn('thread-1', 'call-2', MAIL);
  assert.equal(sent.length, 1);
  assert.ok(reemitted.startsWith('"sent m-1 to ann@example.com"'), reemitted);
  assert.match(reemitted, /an identical call of this tool .* was not run again/);
});

test('the same call in two threads sends two mails', async () => {
  const { sent, turn } = await agent();
  await turn('thread-1', 'call-1', MAIL);
  assert.equal(await turn('thread-2', 'call-1', MAIL), 'sent m-2 to ann@example.com');
  assert.equal(sent.length, 2);
});

test('the model repeating the action with idempotency_key sends a second mail; reusing that key later is told', async () => {
  const { sent, turn, wrapped } = await agent();
  await turn('thread-1', 'call-1', { ...MAIL, idempotency_key: null });
  assert.equal(await turn('thread-1', 'call-2', { ...MAIL, idempotency_key: 'second-reminder' }), 'sent m-2 to ann@example.com');
  assert.deepEqual(sent[1], MAIL, 'the tool gets its own arguments, without the model key');
  assert.equal(sent.length, 2);
  assert.match(await turn('thread-1', 'call-3', { ...MAIL, idempotency_key: 'second-reminder' }), TOLD_DONE);
  assert.equal(sent.length, 2);
  assert.ok('idempotency_key' in wrapped.schema.shape);
});

test('default options, no thread: a constant call id in two conversations sends two mails', async () => {
  const { sent, call } = await agent();
  assert.equal(await call('call_0', MAIL), 'sent m-1 to ann@example.com');
  assert.equal(await call('call_0', MAIL), 'sent m-2 to ann@example.com');
  assert.equal(sent.length, 2);
});

for (const [named, config] of [
  ['a thread (configurable.thread_id)', () => ({ configurable: { thread_id: unique('thread') } })],
  ['a conversation named in metadata (LangSmith threads)', () => ({ metadata: { conversation_id: unique('c') } })],
]) {
  test(`${named}: the call re-emitted after the loop timed it out sends one mail, and the model is told`, async () => {
    const { engine, sent, call, release } = await agent();
    const hold = deferred();
    release.promise = hold.promise; // still sending when the loop gives up on it
    const conversation = config();
    await assert.rejects(call('call-1', MAIL, { ...conversation, signal: AbortSignal.timeout(50) }), /abort|timeout/i);
    hold.resolve();
    await settled(engine);
    const reemitted = await call('call-2', MAIL, conversation);
    assert.equal(sent.length, 1);
    assert.ok(reemitted.startsWith('"sent m-1 to ann@example.com"'), reemitted);
    assert.match(reemitted, /an identical call of this tool .* was not run again/);
  });
}

test('the model sees the optional, nullable idempotency_key and its description under zod 4, zod 3 and JSON schema', async () => {
  const schemas = {
    'zod 4 (the pinned zod)': z.object({ to: z.string(), subject: z.string() }),
    'zod 3 (zod/v3)': z3.object({ to: z3.string(), subject: z3.string() }),
    'JSON schema': { type: 'object', properties: { to: { type: 'string' }, subject: { type: 'string' } }, required: ['to', 'subject'] },
  };
  for (const [library, schema] of Object.entries(schemas)) {
    const { sent, call, wrapped } = await agent(schema);
    // What the model is sent: the fake model's bindTools converts as the providers' do.
    const [shown] = modelCalling([wrapped], 'call-1', MAIL).config.tools;
    const parameters = shown.function.parameters;
    const property = parameters.properties.idempotency_key;
    assert.match(property?.description ?? '', /^Leave empty\. /, `${library}: ${JSON.stringify(parameters)}`);
    assert.deepEqual(parameters.required, ['to', 'subject'], library);
    assert.equal(await call('call-1', { ...MAIL, idempotency_key: null }), 'sent m-1 to ann@example.com', library);
    assert.equal(sent.length, 1);
  }
});

test('a retry after the ttl is not run: an error ToolMessage tells the model it expired, its artifact is OutcomeExpired', async () => {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  const sendEmail = tool(async ({ to }) => {
    sent.push(to);
    return `sent m-${sent.length} to ${to}`;
  }, { name: 'send_email', description: 'Send an email', schema: z.object({ to: z.string(), subject: z.string() }) });
  const wrapped = idempotentLangChainTool(engine, sendEmail, { ttl: 0.3 });
  const config = { configurable: { thread_id: unique('thread') } };
  const call = async () => {
    const ai = await modelCalling([wrapped], 'call-1', MAIL).invoke([['human', 'mail Ann']]);
    return within(wrapped.invoke(ai.tool_calls[0], config), 'the tool call');
  };
  assert.equal((await call()).content, 'sent m-1 to ann@example.com');
  await new Promise((resolve) => setTimeout(resolve, 700));
  const message = await call();
  assert.equal(sent.length, 1);
  assert.equal(message.status, 'error');
  assert.equal(message.tool_call_id, 'call-1');
  assert.match(message.content, /^idemgate: This action was already performed at .*, and its result is no longer kept .*NOT performed again.*idempotency_key set to a new value/);
  assert.ok(message.artifact instanceof OutcomeExpired, String(message.artifact));
  assert.equal(message.content, `idemgate: ${message.artifact.forModel}`);
  // Invoked by the program with plain arguments (no tool call, no model to tell): it throws.
  const plain = idempotentLangChainTool(engine, sendEmail, { ttl: 0.3, key: () => 'order-1' });
  await plain.invoke(MAIL, config);
  await new Promise((resolve) => setTimeout(resolve, 700));
  await assert.rejects(plain.invoke(MAIL, config), OutcomeExpired);
  assert.equal(sent.length, 2);
});
