// One record, every door: what the `idemgate` command line stores is replayed by the Node
// package, and what Node stores is replayed by the command line, on one SQLite file. The same
// logical call lands on the same record when the tenant, the tool, the key and the arguments are
// the same: `idemgate exec` fingerprints `{"argv": [...]}` under its `--tool` (default `exec`)
// and `--tenant` (default `local`).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { Engine, idempotent, MaybeApplied } from '../index.mjs';
import { unique, sqliteStore, within } from './helpers.mjs';

const run = promisify(execFile);
const BIN = process.env.IDEMGATE_BIN;

/** The `idemgate` command on `store` for `tenant`: its exit code, stdout and stderr. */
async function idemgate(store, tenant, ...args) {
  assert.ok(BIN && existsSync(BIN), `IDEMGATE_BIN (${BIN}) must name the idemgate binary: scripts/test-node sets it`);
  const argv = ['--store', store.url, '--journal', store.journal, '--tenant', tenant, ...args];
  try {
    const { stdout, stderr } = await within(run(BIN, argv), `idemgate ${args.join(' ')}`);
    return { code: 0, stdout, stderr };
  } catch (e) {
    if (typeof e.code !== 'number') throw e;
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

test('a command stored by idemgate exec is replayed by Node, which does not run its function', async () => {
  const store = sqliteStore();
  const tenant = unique('t');
  const argv = ['sh', '-c', 'echo hello from the command line'];
  const first = await idemgate(store, tenant, 'exec', '--tool', 'greet', '--key', 'greet-1', '--', ...argv);
  assert.equal(first.code, 0, first.stderr);
  assert.equal(first.stdout, 'hello from the command line\n');

  const engine = await Engine.open(store.url, { journal: store.journal, tenant });
  let runs = 0;
  const r = await engine.call('greet', 'greet-1', { argv }, async () => ++runs);
  assert.equal(runs, 0);
  assert.equal(r.replayed, true);
  assert.equal(r.content, 'command');
  assert.deepEqual(r.value, { exit_code: 0, stdout: 'hello from the command line\n', stderr: '' });
  engine.close();
});

test('a value stored by Node is replayed by idemgate exec, which does not run the command', async () => {
  const store = sqliteStore();
  const tenant = unique('t');
  const marker = path.join(store.dir, 'the-command-ran');
  const argv = ['sh', '-c', `touch ${marker}`];
  const engine = await Engine.open(store.url, { journal: store.journal, tenant });
  const value = { order: 'o-7', charged: 12.5, items: ['a', 'b'], note: 'from Node' };
  const stored = await engine.call('charge', 'order-7', { argv }, async () => value);
  assert.equal(stored.executed, true);
  engine.close();

  const replay = await idemgate(store, tenant, 'exec', '--tool', 'charge', '--key', 'order-7', '--', ...argv);
  assert.equal(replay.code, 0, replay.stderr);
  assert.deepEqual(JSON.parse(replay.stdout), value);
  assert.match(replay.stderr, /replayed the outcome of order-7/);
  assert.equal(existsSync(marker), false, 'the command ran although Node had stored the outcome');

  const shown = await idemgate(store, tenant, 'keys', 'show', 'order-7', '--tool', 'charge', '--json');
  assert.equal(shown.code, 0, shown.stderr);
  const record = JSON.parse(shown.stdout);
  assert.equal(record.content, 'json');
  assert.equal(record.state, 'completed');
  assert.deepEqual(record.result, value);
});

test('an outcome Node left unknown is unknown to idemgate exec too, which does not run the command', async () => {
  const store = sqliteStore();
  const tenant = unique('t');
  const marker = path.join(store.dir, 'the-command-ran');
  const argv = ['sh', '-c', `touch ${marker}`];
  const engine = await Engine.open(store.url, { journal: store.journal, tenant });
  const wire = idempotent(engine, 'wire', async () => {
    throw new MaybeApplied('the bank did not answer');
  }, { key: () => 'wire-1', args: () => ({ argv }) });
  await assert.rejects(wire(), MaybeApplied);
  engine.close();

  const after = await idemgate(store, tenant, 'exec', '--tool', 'wire', '--key', 'wire-1', '--', ...argv);
  assert.notEqual(after.code, 0);
  assert.match(after.stderr, /unknown/);
  assert.equal(existsSync(marker), false, 'the command ran although its outcome was unknown');
});
