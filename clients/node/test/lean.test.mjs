// The wrapper's value-only answers (the addon's lean replies) tell the caller every error the
// whole answer would: an outcome that could not be recorded is never handed back as a plain
// value, and whatever a function throws, its outcome is recorded.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createClient } from '@redis/client';
import { Engine, idempotent, currentKey, LeaseLost } from '../index.mjs';
import { unique, sqliteStore, REDIS_URL } from './helpers.mjs';

test('a function whose record was taken from under it is told so, not handed its value', async () => {
  const prefix = unique('lean');
  const engine = await Engine.open(`${REDIS_URL}?key_prefix=${prefix}:&allow_volatile=true`, {
    journal: sqliteStore().journal, tenant: unique('t'),
  });
  const redis = await createClient({ url: REDIS_URL }).connect();
  try {
    // The function deletes its own record (an operator's hand, a flush): its completion finds
    // the lease gone.
    const vanish = async () => {
      assert.equal(await redis.del(`${prefix}:{${currentKey()}}`), 1, 'the record is where the store keeps it');
      return 'done';
    };
    const lost = idempotent(engine, 'vanish', vanish, { key: (k) => k });
    await assert.rejects(lost('a'), LeaseLost, 'the value-only wrapper');
    await assert.rejects(lost.result('b'), LeaseLost, 'and the whole answer');
    // A value that was recorded still comes back as itself.
    const kept = idempotent(engine, 'kept', async () => 'kept', { key: () => 'c' });
    assert.equal(await kept(), 'kept');
    assert.equal(await kept(), 'kept');
  } finally {
    await redis.quit();
    engine.close();
  }
});

test('whatever a function throws, its outcome is recorded, never left in flight', async () => {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  // A value without a prototype (String() of it throws), and a frozen error (no recording error
  // can be attached to it).
  const thrown = [Object.create(null), Object.freeze(new Error('frozen'))];
  for (const [i, value] of thrown.entries()) {
    const f = idempotent(engine, 'odd', async () => { throw value; }, { key: () => `odd-${i}` });
    await assert.rejects(f(), (e) => e === value, 'the function\'s own exception reaches the caller');
    const state = await engine.recordState('odd', `odd-${i}`);
    assert.equal(state?.state, 'unknown', `thrown value ${i} is recorded (the work may have been done)`);
  }
  // A return value whose serialisation throws something unprintable is recorded too.
  const f = idempotent(engine, 'odd', async () => ({ toJSON() { throw Object.create(null); } }), { key: () => 'odd-json' });
  await assert.rejects(f(), TypeError);
  assert.equal((await engine.recordState('odd', 'odd-json'))?.state, 'unknown');
  engine.close();
});
