// The MCP TypeScript SDK adapter, driven by the SDK's own client over its in-memory transport:
// the three ways a tool call comes back (the same key re-sent, the identical call under a new
// key in the conversation, the model repeating the action on purpose) and conversations apart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { z } from 'zod';
import { Engine, deriveKey } from '../index.mjs';
import { gateTools, KEY_META, CONVERSATION_META } from '../mcp.mjs';
import { unique } from './helpers.mjs';

/** A server with a gated `send_email` (counting the mails it sends) and a read `inbox`, and a
 * client connected to it. */
async function connected() {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  const server = gateTools(engine, new McpServer({ name: 'mail', version: '1.0.0' }), {
    tools: { inbox: { kind: 'read' } },
  });
  server.registerTool('send_email', {
    description: 'Send an email',
    inputSchema: { to: z.string(), subject: z.string() },
  }, async ({ to, subject }) => {
    sent.push({ to, subject });
    return { content: [{ type: 'text', text: `sent m-${sent.length} to ${to}` }] };
  });
  let reads = 0;
  server.registerTool('inbox', { description: 'Count' }, async () => ({ content: [{ type: 'text', text: `read ${++reads}` }] }));
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const client = new Client({ name: 'agent', version: '1.0.0' });
  await Promise.all([server.connect(serverSide), client.connect(clientSide)]);
  /** A call of `send_email` in `conversation` under the call id `callId` (the key a client
   * integration sends: the call id within its conversation). */
  const send = (conversation, callId, args) =>
    client.callTool({
      name: 'send_email',
      arguments: args,
      _meta: { [KEY_META]: deriveKey(conversation, callId), [CONVERSATION_META]: conversation },
    });
  return { client, sent, send };
}

const MAIL = { to: 'ann@example.com', subject: 'invoice' };
const texts = (r) => r.content.map((c) => c.text);

test('the same key re-sent sends one mail and replays its result, marked as a replay', async () => {
  const { sent, send } = await connected();
  const first = await send('conv-1', 'call-1', MAIL);
  const again = await send('conv-1', 'call-1', MAIL);
  assert.equal(sent.length, 1);
  assert.deepEqual(texts(first), ['sent m-1 to ann@example.com']);
  assert.equal(again._meta['dev.idemgate/replayed'], true);
  assert.equal(texts(again)[0], 'sent m-1 to ann@example.com');
  assert.match(texts(again)[1], /^idemgate: this action was already performed at .* and was not repeated/);
});

test('the identical call under a new key in the conversation sends one mail and says it is a repeat', async () => {
  const { sent, send } = await connected();
  await send('conv-1', 'call-1', MAIL);
  const reemitted = await send('conv-1', 'call-2', MAIL);
  assert.equal(sent.length, 1);
  assert.equal(reemitted._meta['dev.idemgate/rule'], 'fallback');
  assert.equal(texts(reemitted)[0], 'sent m-1 to ann@example.com');
  assert.match(texts(reemitted)[1], /an identical call of this tool .* was not run again/);
});

test('the same call in two conversations sends two mails', async () => {
  const { sent, send } = await connected();
  await send('conv-1', 'call-1', MAIL);
  const other = await send('conv-2', 'call-1', MAIL);
  assert.equal(sent.length, 2);
  assert.deepEqual(texts(other), ['sent m-2 to ann@example.com']);
});

test('the model repeating the action with idempotency_key sends a second mail', async () => {
  const { sent, send, client } = await connected();
  await send('conv-1', 'call-1', MAIL);
  const repeat = await send('conv-1', 'call-2', { ...MAIL, idempotency_key: 'second-reminder' });
  assert.equal(sent.length, 2);
  assert.deepEqual(sent[1], MAIL, 'the tool gets its own arguments, without the model key');
  assert.deepEqual(texts(repeat), ['sent m-2 to ann@example.com']);
  const { tools } = await client.listTools();
  const schema = tools.find((t) => t.name === 'send_email').inputSchema;
  assert.match(schema.properties.idempotency_key.description, /do an action again on purpose/);
  assert.deepEqual(schema.required.sort(), ['subject', 'to']);
});

test('a write sent without any key is refused with what to send, and a read is not gated', async () => {
  const { sent, client } = await connected();
  const refused = await client.callTool({ name: 'send_email', arguments: MAIL });
  assert.equal(refused.isError, true);
  assert.match(texts(refused)[0], /^idemgate: /);
  assert.equal(sent.length, 0);
  const reads = [await client.callTool({ name: 'inbox', arguments: {} }), await client.callTool({ name: 'inbox', arguments: {} })];
  assert.deepEqual(reads.map((r) => texts(r)[0]), ['read 1', 'read 2']);
});
