// The LangChain.js adapter, its tool invoked with tool calls as a LangGraph ToolNode invokes it
// (a ToolCall in, a ToolMessage out, the conversation as `configurable.thread_id`): the three
// ways a tool call comes back and conversations kept apart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { tool } from '@langchain/core/tools';
import { z } from 'zod';
import { Engine } from '../index.mjs';
import { idempotentLangChainTool } from '../langchain.mjs';
import { unique } from './helpers.mjs';

async function agent() {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  const sendEmail = tool(async ({ to, subject }) => {
    sent.push({ to, subject });
    return `sent m-${sent.length} to ${to}`;
  }, { name: 'send_email', description: 'Send an email', schema: z.object({ to: z.string(), subject: z.string() }) });
  const wrapped = idempotentLangChainTool(engine, sendEmail);
  /** The ToolMessage's content of one tool call in `thread`. */
  const turn = async (thread, id, args) => {
    const message = await wrapped.invoke({ name: 'send_email', args, id, type: 'tool_call' }, { configurable: { thread_id: thread } });
    assert.equal(message.tool_call_id, id);
    return message.content;
  };
  return { sent, turn, wrapped };
}

const MAIL = { to: 'ann@example.com', subject: 'invoice' };

test('the same tool call id re-sent in a thread sends one mail and answers its result', async () => {
  const { sent, turn } = await agent();
  assert.equal(await turn('thread-1', 'call-1', MAIL), 'sent m-1 to ann@example.com');
  assert.equal(await turn('thread-1', 'call-1', MAIL), 'sent m-1 to ann@example.com');
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

test('the model repeating the action with idempotency_key sends a second mail', async () => {
  const { sent, turn, wrapped } = await agent();
  await turn('thread-1', 'call-1', MAIL);
  assert.equal(await turn('thread-1', 'call-2', { ...MAIL, idempotency_key: 'second-reminder' }), 'sent m-2 to ann@example.com');
  assert.deepEqual(sent[1], MAIL, 'the tool gets its own arguments, without the model key');
  assert.equal(sent.length, 2);
  assert.ok('idempotency_key' in wrapped.schema.shape);
});
