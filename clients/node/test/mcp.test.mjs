// The MCP TypeScript SDK adapter, driven by the SDK's own client, over its in-memory transport
// and over stdio (a gated server process per client, as agents start them): the same key
// re-sent, the identical call re-sent without a key (the window), the model repeating the
// action on purpose, which keys reach across sessions (the orchestration layer's and the
// program's) and which do not (the model's), and sessionless clients kept apart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { z } from 'zod';
import { Engine, deriveKey } from '../index.mjs';
import { gateTools, KEY_META, CALL_ID_META, CONVERSATION_META } from '../mcp.mjs';
import { scratch, sqliteStore, unique, within } from './helpers.mjs';

const GATED_SERVER = fileURLToPath(new URL('./fixtures/gated-mail-server.mjs', import.meta.url));

/** An engine and the mails its servers send. */
async function world(tools = {}, key = undefined) {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  /** A gated server (`send_email`, counting the mails it sends, and a read `inbox`) and a client
   * connected to it: one session. */
  const session = async () => {
    const server = gateTools(engine, new McpServer({ name: 'mail', version: '1.0.0' }), {
      tools: { inbox: { kind: 'read' }, ...tools },
      key,
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
    return client;
  };
  return { engine, sent, session };
}

/** A world and one session of it, with `send(conversation, callId, args)`: a call carrying its
 * tool-call id and its conversation, as the client integrations send them (`idemgate mcp`
 * reads the same), and `sendKeyed(key, args)`: a call with an orchestration key. */
async function connected(tools) {
  const w = await world(tools);
  const client = await w.session();
  const send = (conversation, callId, args) =>
    client.callTool({
      name: 'send_email',
      arguments: args,
      _meta: { [CALL_ID_META]: callId, [CONVERSATION_META]: conversation },
    });
  const sendKeyed = (key, args) =>
    client.callTool({ name: 'send_email', arguments: args, _meta: { [KEY_META]: key } });
  return { ...w, client, send, sendKeyed };
}

const MAIL = { to: 'ann@example.com', subject: 'invoice' };
const texts = (r) => r.content.map((c) => c.text);
const TOLD_DONE = /^idemgate: this action was already performed at .* and was not repeated/;

test('the same key re-sent sends one mail and replays its result, marked as a replay', async () => {
  const { sent, send } = await connected();
  const first = await send('conv-1', 'call-1', MAIL);
  const again = await send('conv-1', 'call-1', MAIL);
  assert.equal(sent.length, 1);
  assert.deepEqual(texts(first), ['sent m-1 to ann@example.com']);
  assert.equal(again._meta['dev.idemgate/replayed'], true);
  assert.equal(texts(again)[0], 'sent m-1 to ann@example.com');
  assert.match(texts(again)[1], TOLD_DONE);
});

test('the identical call sent again without a key, under the tool\'s window, sends one mail and says it is a repeat', async () => {
  const { sent, client } = await connected({ send_email: { window: 60 } });
  await client.callTool({ name: 'send_email', arguments: MAIL });
  const reemitted = await client.callTool({ name: 'send_email', arguments: MAIL });
  assert.equal(sent.length, 1);
  assert.equal(reemitted._meta['dev.idemgate/rule'], 'fallback');
  assert.equal(texts(reemitted)[0], 'sent m-1 to ann@example.com');
  assert.match(texts(reemitted)[1], /an identical call of this tool .* was not run again/);
});

test('the identical call under a new call id in the conversation sends one mail and says it is a repeat', async () => {
  // The call id names the action within its conversation, and the window inside its record
  // joins a re-emission under a new id, with the tool's default policy (no window of its own).
  const { sent, send } = await connected();
  await send('conv-1', 'call-1', MAIL);
  const reemitted = await send('conv-1', 'call-2', MAIL);
  assert.equal(sent.length, 1);
  assert.equal(texts(reemitted)[0], 'sent m-1 to ann@example.com');
  assert.match(texts(reemitted)[1], /was not run again/);
});

test('a new orchestration key is a new action, even for identical arguments in the conversation', async () => {
  // A `_meta` key is the orchestration layer's name of the action (the kit's rule, as at
  // `idemgate mcp`): a new one names a new action, and no window second-guesses it.
  const { sent, sendKeyed } = await connected({ send_email: { window: 60 } });
  await sendKeyed(deriveKey('run-1', 'step-1'), MAIL);
  const second = await sendKeyed(deriveKey('run-1', 'step-2'), MAIL);
  assert.equal(sent.length, 2);
  assert.deepEqual(texts(second), ['sent m-2 to ann@example.com']);
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
  const repeat = await client.callTool({ name: 'send_email', arguments: { ...MAIL, idempotency_key: 'second-reminder' } });
  assert.equal(sent.length, 2);
  assert.deepEqual(sent[1], MAIL, 'the tool gets its own arguments, without the model key');
  assert.deepEqual(texts(repeat), ['sent m-2 to ann@example.com']);
  const nullKey = await client.callTool({ name: 'send_email', arguments: { ...MAIL, idempotency_key: null } });
  assert.match(texts(nullKey)[0], /^idemgate: /, 'null is no key: refused without a window');
  const { tools } = await client.listTools();
  const schema = tools.find((t) => t.name === 'send_email').inputSchema;
  assert.match(schema.properties.idempotency_key.description, /^Leave empty\. .*do an action again on purpose/);
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

test('a model-chosen idempotency_key names an action within its session only: the same key in two sessions sends two mails', async () => {
  const { sent, session } = await world();
  const [a, b] = [await session(), await session()];
  const call = (client) => client.callTool({ name: 'send_email', arguments: { ...MAIL, idempotency_key: '1' } });
  assert.deepEqual(texts(await call(a)), ['sent m-1 to ann@example.com']);
  assert.deepEqual(texts(await call(b)), ['sent m-2 to ann@example.com']);
  const later = await call(a);
  assert.equal(sent.length, 2);
  assert.match(texts(later)[1], TOLD_DONE, 'the model reusing its key in its session is told');
});

test('orchestration keys (_meta, params.idempotencyKey) and the program\'s key name the action in every session', async () => {
  const { sent, session } = await world({}, (args) => (args.subject === 'order-7' ? 'order-7' : null));
  const [a, b] = [await session(), await session()];
  const byMeta = { name: 'send_email', arguments: MAIL, _meta: { [KEY_META]: 'mail-1' } };
  const byParam = { name: 'send_email', arguments: { ...MAIL, subject: 'receipt' }, idempotencyKey: 'mail-2' };
  const byProgram = { name: 'send_email', arguments: { ...MAIL, subject: 'order-7' } };
  for (const request of [byMeta, byParam, byProgram]) {
    await a.callTool(request);
    const other = await b.callTool(request);
    assert.equal(other._meta['dev.idemgate/replayed'], true, JSON.stringify(request));
    assert.match(texts(other)[1], TOLD_DONE);
  }
  assert.equal(sent.length, 3);
});

/** A client of its own gated server process on stdio (the store shared by every process). */
async function stdioClient(store, outbox, policies) {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [GATED_SERVER, store.url, store.journal, outbox, JSON.stringify(policies)],
    stderr: 'inherit',
  });
  const client = new Client({ name: 'agent', version: '1.0.0' });
  await within(client.connect(transport), 'the stdio server to start');
  return client;
}

const linesOf = (file) => readFileSync(file, 'utf8').split('\n').filter(Boolean);

test('stdio, with the window across processes: two clients sending the same arguments send two mails; one conversation named by both is joined', async () => {
  const store = sqliteStore();
  const outbox = path.join(scratch(), 'outbox');
  writeFileSync(outbox, '');
  const policies = { send_email: { window: 60 } };
  const [a, b] = [await stdioClient(store, outbox, policies), await stdioClient(store, outbox, policies)];
  try {
    await a.callTool({ name: 'send_email', arguments: MAIL });
    const other = await b.callTool({ name: 'send_email', arguments: MAIL });
    assert.deepEqual(texts(other), ['sent to ann@example.com'], 'another client is another conversation');
    const shared = { name: 'send_email', arguments: { ...MAIL, subject: 'joined' }, _meta: { [CONVERSATION_META]: 'c-1' } };
    await a.callTool(shared);
    const joined = await b.callTool(shared);
    assert.match(texts(joined)[1], /an identical call of this tool .* in this conversation, .* was not run again/);
    assert.deepEqual(linesOf(outbox), ['ann@example.com invoice', 'ann@example.com invoice', 'ann@example.com joined']);
  } finally {
    await Promise.all([a.close(), b.close()]);
  }
});

test('stdio: the identical call re-sent after the client timed out sends one mail, and the model is told', async () => {
  const store = sqliteStore();
  const outbox = path.join(scratch(), 'outbox');
  writeFileSync(outbox, '');
  const client = await stdioClient(store, outbox, { send_email: { window: 60 } });
  try {
    const slow = { name: 'send_email', arguments: { ...MAIL, subject: 'slow' } };
    // The mail goes out, but the call hangs until `release`: the client gives up first.
    await assert.rejects(client.callTool(slow, undefined, { timeout: 100 }), /timed out/i);
    await client.callTool({ name: 'release', arguments: {} });
    const reemitted = await client.callTool(slow);
    assert.equal(texts(reemitted)[0], 'sent to ann@example.com');
    assert.match(texts(reemitted)[1], /an identical call of this tool .* was not run again/);
    assert.deepEqual(linesOf(outbox), ['ann@example.com slow']);
  } finally {
    await client.close();
  }
});

test('a retry after the ttl is not run: an error result tells the model it expired, its _meta the program', async () => {
  const { sent, send } = await connected({ send_email: { ttl: 0.3 } });
  assert.deepEqual(texts(await send('conv-1', 'call-1', MAIL)), ['sent m-1 to ann@example.com']);
  await new Promise((resolve) => setTimeout(resolve, 700));
  const expired = await send('conv-1', 'call-1', MAIL);
  assert.equal(sent.length, 1);
  assert.equal(expired.isError, true);
  assert.match(texts(expired)[0], /^idemgate: This action was already performed at .*, and its result is no longer kept .*NOT performed again.*idempotency_key set to a new value/);
  assert.equal(expired._meta['dev.idemgate/verdict'], 'expired');
  assert.equal(expired._meta['dev.idemgate/problem'], 'https://idemgate.dev/problems/outcome-expired');
  assert.equal(typeof expired._meta['dev.idemgate/fence'], 'number');
  assert.match(expired._meta['dev.idemgate/executed_at'], /^\d{4}-\d\d-\d\dT/);
  assert.ok(texts(expired)[0].includes(expired._meta['dev.idemgate/executed_at']));
});
