// One record, every door: what the `idemgate` command line and the Python package store is
// replayed by the Node package, and what Node stores is replayed by them, on one SQLite file. The same
// logical call lands on the same record when the tenant, the tool, the key and the arguments are
// the same: `idemgate exec` fingerprints `{"argv": [...]}` under its `--tool` (default `exec`)
// and `--tenant` (default `local`).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { Engine, idempotent, MaybeApplied, OutcomeUnknown } from '../index.mjs';
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

// The Python package and the Node package on one SQLite file: the same decorated function in
// both languages (the default fingerprint of both is `{"args": [...], "kwargs": {}}`) is one
// action. The Python is the package `pip install ./clients/python` put in scripts/test-all's
// venv (IDEMGATE_TEST_PYTHON, set by scripts/test-node).
const PYTHON = process.env.IDEMGATE_TEST_PYTHON;

/** Runs `code` in the Python package's interpreter with `env` and returns what it printed as
 * JSON (its last line). */
async function python(code, env) {
  assert.ok(PYTHON && existsSync(PYTHON), `IDEMGATE_TEST_PYTHON (${PYTHON}) must name a Python with the idemgate package: scripts/test-node sets it`);
  const { stdout } = await within(
    run(PYTHON, ['-c', code], { env: { ...process.env, ...env } }),
    'the Python side',
  );
  return JSON.parse(stdout.trim().split('\n').pop());
}

const PY_CHARGE = `
import json, os, pathlib
from idemgate import Engine, idempotent, MaybeApplied, OutcomeUnknown
engine = Engine.open(os.environ["STORE"], journal=os.environ["JOURNAL"], tenant=os.environ["TENANT"])
ran = pathlib.Path(os.environ["MARKER"])

@idempotent(engine, "charge", key=lambda order: order["id"])
def charge(order):
    ran.touch()
    if order.get("fail"):
        raise MaybeApplied("the bank timed out")
    return {"charged": order["amount"], "by": "python"}

order = json.loads(os.environ["ORDER"])
try:
    r = charge.result(order)
    print(json.dumps({"value": r.value, "replayed": r.replayed, "ran": ran.exists()}))
except (MaybeApplied, OutcomeUnknown) as e:
    print(json.dumps({"error": type(e).__name__, "ran": ran.exists()}))
`;

test('a function Python ran is replayed by Node, and one Node ran is replayed by Python', async () => {
  const store = sqliteStore();
  const tenant = unique('t');
  const env = (order, marker) => ({
    STORE: store.url, JOURNAL: store.journal, TENANT: tenant, ORDER: JSON.stringify(order),
    MARKER: path.join(store.dir, marker),
  });
  const fromPython = await python(PY_CHARGE, env({ id: 'o-py', amount: 3 }, 'py-ran-1'));
  assert.deepEqual(fromPython, { value: { charged: 3, by: 'python' }, replayed: false, ran: true });

  const engine = await Engine.open(store.url, { journal: store.journal, tenant });
  let runs = 0;
  const charge = idempotent(engine, 'charge', async (order) => {
    runs += 1;
    return { charged: order.amount, by: 'node' };
  }, { key: (order) => order.id });
  const replay = await charge.result({ id: 'o-py', amount: 3 });
  assert.equal(runs, 0, 'Node ran a function Python had run');
  assert.equal(replay.replayed, true);
  assert.deepEqual(replay.value, { charged: 3, by: 'python' });

  assert.deepEqual(await charge({ id: 'o-node', amount: 4 }), { charged: 4, by: 'node' });
  engine.close();
  const fromNode = await python(PY_CHARGE, env({ id: 'o-node', amount: 4 }, 'py-ran-2'));
  assert.deepEqual(fromNode, { value: { charged: 4, by: 'node' }, replayed: true, ran: false });
});

test('an outcome Python left unknown is unknown to Node; Node resolves it and Python replays that', async () => {
  const store = sqliteStore();
  const tenant = unique('t');
  const env = (order, marker) => ({
    STORE: store.url, JOURNAL: store.journal, TENANT: tenant, ORDER: JSON.stringify(order),
    MARKER: path.join(store.dir, marker),
  });
  const failed = await python(PY_CHARGE, env({ id: 'o-9', amount: 9, fail: true }, 'ran-1'));
  assert.deepEqual(failed, { error: 'MaybeApplied', ran: true });

  const engine = await Engine.open(store.url, { journal: store.journal, tenant });
  const charge = idempotent(engine, 'charge', async () => assert.fail('Node ran an unknown action'), {
    key: (order) => order.id,
  });
  await assert.rejects(charge({ id: 'o-9', amount: 9, fail: true }), OutcomeUnknown);
  const [rec] = await engine.records({ state: 'unknown', tool: 'charge' });
  assert.equal(rec.key.key, 'o-9');
  await engine.resolve('charge', 'o-9', rec.fence, 'completed', {
    result: { charged: 9, by: 'the bank statement' },
    reason: 'the statement shows the charge',
  });
  engine.close();

  const replayed = await python(PY_CHARGE, env({ id: 'o-9', amount: 9, fail: true }, 'ran-2'));
  assert.deepEqual(replayed, { value: { charged: 9, by: 'the bank statement' }, replayed: true, ran: false });
});
