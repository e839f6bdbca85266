// The OpenAI Agents SDK for JS adapter, driven by the SDK's own run loop with a scripted model:
// the three ways a tool call comes back and conversations kept apart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Agent, Runner, tool, Usage, setTracingDisabled } from '@openai/agents-core';
import { z } from 'zod';
import { Engine } from '../index.mjs';
import { idempotentFunctionTool } from '../openai-agents.mjs';
import { unique } from './helpers.mjs';

setTracingDisabled(true);

/** A model that calls `send_email` with `input` under `callId`, then says it is done. */
function modelCalling(callId, input) {
  let turns = 0;
  return {
    async getResponse() {
      turns += 1;
      const output = turns === 1
        ? [{ type: 'function_call', callId, name: 'send_email', arguments: JSON.stringify(input), status: 'completed' }]
        : [{ type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'done' }] }];
      return { usage: new Usage(), output };
    },
    async *getStreamedResponse() {
      throw new Error('not streamed');
    },
  };
}

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
  /** One run of `conversation` in which the model calls the tool once: the tool's output. */
  const turn = async (conversation, callId, input) => {
    const wrapped = idempotentFunctionTool(engine, sendEmail, { scope: conversation });
    const a = new Agent({ name: 'mailer', instructions: 'mail', tools: [wrapped], model: modelCalling(callId, input) });
    const result = await runner.run(a, 'mail Ann');
    const outputs = result.newItems.filter((i) => i.type === 'tool_call_output_item');
    assert.equal(outputs.length, 1);
    return outputs[0].output;
  };
  return { sent, turn, sendEmail, engine };
}

const MAIL = { to: 'ann@example.com', subject: 'invoice' };

test('the same call id re-sent in a conversation sends one mail and answers its result', async () => {
  const { sent, turn } = await agent();
  assert.equal(await turn('conv-1', 'call-1', MAIL), 'sent m-1 to ann@example.com');
  assert.equal(await turn('conv-1', 'call-1', MAIL), 'sent m-1 to ann@example.com');
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

test('the model repeating the action with idempotency_key sends a second mail', async () => {
  const { sent, turn, sendEmail, engine } = await agent();
  await turn('conv-1', 'call-1', { ...MAIL, idempotency_key: null });
  assert.equal(await turn('conv-1', 'call-2', { ...MAIL, idempotency_key: 'second-reminder' }), 'sent m-2 to ann@example.com');
  assert.deepEqual(sent[1], MAIL, 'the tool gets its own arguments, without the model key');
  assert.equal(sent.length, 2);
  const schema = idempotentFunctionTool(engine, sendEmail).parameters;
  assert.match(schema.properties.idempotency_key.description, /do an action again on purpose/);
});
