// A call whose process dies mid-call (SIGKILL) leaves its record unknown: the next call of the
// key is told OutcomeUnknown and never runs the function again.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { Engine, idempotent, OutcomeUnknown } from '../index.mjs';
import { unique, sqliteStore, within } from './helpers.mjs';

const VICTIM = fileURLToPath(new URL('./fixtures/call-then-hang.mjs', import.meta.url));

/** The first line the child writes on stdout. */
async function firstLine(child) {
  let out = '';
  for await (const chunk of child.stdout) {
    out += chunk;
    const nl = out.indexOf('\n');
    if (nl >= 0) return out.slice(0, nl);
  }
  throw new Error(`the child exited before it said anything (stdout: ${JSON.stringify(out)})`);
}

test('a call killed mid-function leaves its outcome unknown, and the next call does not run it', async () => {
  const { url, journal } = sqliteStore();
  const tenant = unique('t');
  const child = spawn(process.execPath, [VICTIM, url, tenant, journal, 'charge', 'order-9'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = once(child, 'exit');
  const line = await within(firstLine(child), 'the child to run its function');
  assert.equal(line, `running ${child.pid}`);
  assert.ok(child.pid > 0);
  process.kill(child.pid, 'SIGKILL');
  const [, signal] = await within(exited, 'the child to die');
  assert.equal(signal, 'SIGKILL');

  const engine = await Engine.open(url, { tenant, journal });
  let runs = 0;
  const charge = idempotent(engine, 'charge', async () => {
    runs += 1;
    return 'charged twice';
  }, { key: () => 'order-9', wait: 60 });
  // Waits for the dead call's lease (1 s) to run out, then is told the outcome is unknown.
  const e = await within(charge().catch((err) => err), 'the duplicate to be answered');
  assert.ok(e instanceof OutcomeUnknown, String(e));
  assert.equal(runs, 0);
  assert.equal((await engine.recordState('charge', 'order-9')).state, 'unknown');
  await assert.rejects(charge(), OutcomeUnknown);
  assert.equal(runs, 0);
  engine.close();
});
