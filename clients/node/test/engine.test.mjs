// The engine in-process: once per key on every store, racing duplicates, exceptions recorded as
// the Python package records them, cancellation, and the error classes of every verdict.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import {
  Engine, idempotent, currentKey, deriveKey, Failed, NotApplied, MaybeApplied, OutcomeUnknown,
  KeyReused, KeyRequired, InFlight, StoreMisconfigured, StoreUnavailable, IdemgateError, Conflict,
  NotFound, NotResolvable, OutcomeExpired,
} from '../index.mjs';
import { unique, sqliteStore, deferred, within, POSTGRES_URL, REDIS_URL } from './helpers.mjs';

/** Waits past the 0.3 s ttl of the expiry tests (the records expire by the clock). */
const pastTtl = () => new Promise((resolve) => setTimeout(resolve, 700));

const require = createRequire(import.meta.url);

/** The stores every behaviour runs on: each opened fresh, with a tenant of its own. */
const STORES = {
  memory: () => Engine.open('memory:', { tenant: unique('t') }),
  sqlite: () => {
    const { url, journal } = sqliteStore();
    return Engine.open(url, { journal, tenant: unique('t') });
  },
  postgres: () => Engine.open(POSTGRES_URL, { journal: sqliteStore().journal, tenant: unique('t') }),
  redis: () =>
    Engine.open(`${REDIS_URL}?key_prefix=${unique('node')}:&allow_volatile=true`, { journal: sqliteStore().journal, tenant: unique('t') }),
};

for (const [store, open] of Object.entries(STORES)) {
  describe(`on the ${store} store`, () => {
    test('a function runs once per key and duplicates get its stored value', async () => {
      const engine = await open();
      let runs = 0;
      const charge = idempotent(engine, 'charge', async (order) => {
        runs += 1;
        return { charged: order.amount, run: runs };
      }, { key: (order) => order.id });
      const first = await charge({ id: 'order-1', amount: 12 });
      const again = await charge({ id: 'order-1', amount: 12 });
      assert.deepEqual(first, { charged: 12, run: 1 });
      assert.deepEqual(again, first);
      assert.equal(runs, 1);
      const other = await charge({ id: 'order-2', amount: 5 });
      assert.deepEqual(other, { charged: 5, run: 2 });
      engine.close();
    });

    test('racing duplicates of one key run the function exactly once', async () => {
      const engine = await open();
      let runs = 0;
      const release = deferred();
      const started = deferred();
      const send = idempotent(engine, 'send_mail', async (to) => {
        runs += 1;
        started.resolve();
        await release.promise;
        return `sent to ${to}`;
      }, { key: () => 'mail-1', wait: 60 });
      const calls = Array.from({ length: 8 }, () => send.result('a@example.com'));
      await within(started.promise, 'the first call to start');
      release.resolve();
      const results = await within(Promise.all(calls), 'every duplicate to answer');
      assert.equal(runs, 1);
      assert.equal(results.filter((r) => r.executed).length, 1);
      assert.equal(results.filter((r) => r.replayed).length, 7);
      for (const r of results) assert.equal(r.value, 'sent to a@example.com');
      engine.close();
    });

    test('a function that outlives its lease keeps it: the record stays in flight, never unknown', async () => {
      const engine = await open();
      const release = deferred();
      const started = deferred();
      let runs = 0;
      const slow = idempotent(engine, 'slow', async () => {
        runs += 1;
        started.resolve();
        await release.promise;
        return 'done';
      }, { key: () => 'slow-1', lease: 1, wait: 0 });
      const first = slow.result();
      await within(started.promise, 'the call to start');
      const taken = await engine.record('slow', 'slow-1');
      const firstExpiry = Date.parse(taken.lease_until);
      // Once the first lease has run out (a crashed caller's record is unknown then, as
      // crash.test.mjs shows), the heartbeats have kept it in flight at the same fence.
      await within((async () => {
        while (Date.now() <= firstExpiry + 100) await new Promise((r) => setTimeout(r, 50));
      })(), 'the first lease to run out');
      const kept = await engine.record('slow', 'slow-1');
      assert.equal(kept.state, 'in_flight');
      assert.equal(kept.fence, taken.fence);
      assert.ok(Date.parse(kept.lease_until) > firstExpiry, `renewed: ${kept.lease_until}`);
      await assert.rejects(slow(), InFlight);
      release.resolve();
      assert.equal((await first).executed, true);
      assert.equal(await slow(), 'done');
      assert.equal(runs, 1);
      engine.close();
    });

    test('an operator lists an unknown record, resolves it, and later reopens it', async () => {
      const engine = await open();
      let runs = 0;
      const refund = idempotent(engine, 'refund', async (id) => {
        runs += 1;
        if (runs === 1) throw new MaybeApplied('the bank timed out');
        return { refunded: id, run: runs };
      }, { key: (id) => id });
      await assert.rejects(refund('r-1'), MaybeApplied);
      const unknownError = await refund('r-1').catch((e) => e);
      assert.ok(unknownError instanceof OutcomeUnknown, String(unknownError));
      assert.match(unknownError.message, /await engine\.resolve\(tool, key, \d+, 'completed', \{ result \}\)/);
      const unknown = await engine.records({ state: 'unknown', tool: 'refund' });
      assert.equal(unknown.length, 1);
      const [rec] = unknown;
      assert.deepEqual(rec.key, { tenant: engine.tenant, tool: 'refund', key: 'r-1' });
      assert.equal(rec.state, 'unknown');
      assert.deepEqual(await engine.records({ state: 'completed', tool: 'refund' }), []);
      await assert.rejects(
        engine.resolve('refund', 'r-1', rec.fence + 1, 'completed', { result: { refunded: 'r-1' } }),
        NotResolvable,
      );
      const after = await engine.resolve('refund', 'r-1', rec.fence, 'completed', {
        result: { refunded: 'r-1', by: 'the bank' },
        reason: 'the bank statement shows it',
        by: 'ops@example.com',
      });
      assert.equal(after.state, 'completed');
      assert.deepEqual(after.outcome.body, { refunded: 'r-1', by: 'the bank' });
      const replay = await refund.result('r-1');
      assert.equal(replay.replayed, true);
      assert.deepEqual(replay.value, { refunded: 'r-1', by: 'the bank' });
      assert.match(replay.explanation, /operator/);
      assert.equal(runs, 1);
      await assert.rejects(engine.reopen('refund', 'r-1', after.fence, {}), TypeError);
      assert.equal(await engine.reopen('refund', 'r-1', after.fence, { reason: 'refunded twice by mistake' }), 'completed');
      assert.deepEqual(await refund('r-1'), { refunded: 'r-1', run: 2 });
      assert.equal(await engine.record('refund', 'missing'), null);
      await assert.rejects(engine.reopen('refund', 'missing', 1, { reason: 'x' }), NotFound);
      engine.close();
    });

    test('a retry after the ttl is not run again: OutcomeExpired, until a reopening; tombstone 0 runs it', async () => {
      const engine = await open();
      let runs = 0;
      const mail = async () => ({ sent: ++runs });
      const ttl = 0.3;
      const first = await engine.call('mail', 'm-1', { to: 'ann' }, mail, { ttl });
      assert.equal(first.executed, true);
      // Within the ttl: the stored outcome.
      assert.equal((await engine.call('mail', 'm-1', { to: 'ann' }, mail, { ttl })).replayed, true);
      await pastTtl();
      const e = await engine.call('mail', 'm-1', { to: 'ann' }, mail, { ttl }).catch((err) => err);
      assert.ok(e instanceof OutcomeExpired, String(e));
      assert.ok(e instanceof IdemgateError && !(e instanceof Conflict), 'a 410, not a conflict');
      assert.equal(runs, 1, 'not run again');
      assert.equal(e.status, 410);
      assert.equal(e.verdict, 'expired');
      assert.equal(e.problem.type, 'https://idemgate.dev/problems/outcome-expired');
      assert.equal(e.problem.title, 'Outcome expired');
      assert.equal(e.key, 'm-1');
      assert.equal(e.rule, 'explicit');
      assert.equal(e.executedAt, first.executedAt.toISOString());
      assert.equal(e.expiredAt, first.expiresAt.toISOString());
      // The default tombstone: 30 days after the call ran.
      assert.equal(Date.parse(e.retainUntil) - first.executedAt.getTime(), 30 * 86_400_000);
      assert.equal(typeof e.fence, 'number');
      assert.match(e.message, /already ran at .* its outcome is no longer kept .* so it was not run now/);
      assert.match(e.message, new RegExp(`await engine\\.reopen\\(tool, key, ${e.fence}, `));
      assert.match(e.forModel, new RegExp(`^This action was already performed at ${e.executedAt}, and its result is no longer kept .*NOT performed again`));
      assert.match(e.forModel, /idempotency_key set to a new value/);
      // The record shows it: expired, at the fence a reopening names.
      assert.equal((await engine.records({ state: 'expired', tool: 'mail' })).length, 1);
      const rec = await engine.record('mail', 'm-1');
      assert.equal(rec.state, 'expired');
      assert.equal(rec.fence, e.fence);
      // Reopening clears it: the next call runs the action again.
      await assert.rejects(engine.reopen('mail', 'm-1', e.fence + 1, { reason: 'stale fence' }), NotResolvable);
      assert.equal(await engine.reopen('mail', 'm-1', e.fence, { reason: 'the mail bounced; send it again' }), 'expired');
      const again = await engine.call('mail', 'm-1', { to: 'ann' }, mail, { ttl });
      assert.equal(again.executed, true);
      assert.deepEqual(again.value, { sent: 2 });
      // The record's story, from the store: the reopening, who and why, then the new run.
      const told = await engine.record('mail', 'm-1');
      assert.match(told.downstream_key, /^[0-9a-f]{64}$/);
      const reopened = told.history.find((s) => s.what === 'reopened');
      assert.equal(reopened.reason, 'the mail bounced; send it again');
      assert.match(reopened.text, /^reopened \(was expired\)/);
      assert.equal(told.history.at(-1).what, 'completed');
      // A tool that keeps no tombstone runs a retry after its ttl again; so does its wrapper.
      const bare = idempotent(engine, 'ping', mail, { key: () => 'p-1', ttl, tombstone: 0 });
      await bare();
      await pastTtl();
      assert.deepEqual(await bare(), { sent: 4 });
      engine.close();
    });
  });
}

describe('the addon answers at once when no I/O is needed', () => {
  test('on the memory store begin and finish return their reply, not a promise; on SQLite a promise', async () => {
    const native = require('../native.cjs');
    const call = ['fast', 'f-1', '{}']; // tool, key, arguments' JSON (the policy's defaults)
    const memory = await native.openEngine('memory:', null, unique('t'));
    const begun = memory.begin(...call);
    assert.equal(typeof begun, 'string', 'a fresh reservation in memory needs no runtime hop');
    const { execute } = JSON.parse(begun);
    assert.equal(typeof memory.finish(execute, 'success', '1'), 'string');
    assert.equal(JSON.parse(memory.begin(...call)).verdict, 'replayed');
    memory.close();
    const { url, journal } = sqliteStore();
    const disk = await native.openEngine(url, journal, unique('t'));
    const pending = disk.begin(...call);
    assert.ok(pending instanceof Promise, 'a SQLite write goes through the runtime');
    const ticket = JSON.parse(await pending).execute;
    assert.equal(typeof ticket, 'number');
    assert.equal(JSON.parse(await disk.finish(ticket, 'success', '1')).verdict, 'executed');
    // A replay the engine read a moment ago comes from its cache: no store round trip.
    assert.equal(JSON.parse(await disk.begin(...call)).verdict, 'replayed');
    assert.equal(typeof disk.begin(...call), 'string');
    disk.close();
  });
});

describe('what a function throws', () => {
  test('Failed is stored and replayed as Failed, without running again', async () => {
    const engine = await STORES.sqlite();
    let runs = 0;
    const pay = idempotent(engine, 'pay', async () => {
      runs += 1;
      throw new Failed({ code: 'card_declined' });
    }, { key: () => 'pay-1' });
    const first = await pay().catch((e) => e);
    assert.ok(first instanceof Failed);
    assert.equal(first.replayed, false);
    const replay = await pay().catch((e) => e);
    assert.ok(replay instanceof Failed);
    assert.equal(replay.replayed, true);
    assert.deepEqual(replay.result, { code: 'card_declined' });
    assert.equal(runs, 1);
  });

  test('NotApplied releases the key, so the next call runs', async () => {
    const engine = await STORES.memory();
    let runs = 0;
    const book = idempotent(engine, 'book', async () => {
      runs += 1;
      if (runs === 1) throw new NotApplied('no seat free yet');
      return 'booked';
    }, { key: () => 'seat-1' });
    await assert.rejects(book(), NotApplied);
    assert.equal(await book(), 'booked');
    assert.equal(runs, 2);
  });

  test('any other exception makes the outcome unknown: duplicates get OutcomeUnknown', async () => {
    const engine = await STORES.memory();
    let runs = 0;
    const transfer = idempotent(engine, 'transfer', async () => {
      runs += 1;
      throw new MaybeApplied('the bank timed out');
    }, { key: () => 'tr-1' });
    await assert.rejects(transfer(), MaybeApplied);
    const e = await transfer().catch((err) => err);
    assert.ok(e instanceof OutcomeUnknown, String(e));
    assert.ok(e instanceof Conflict && e instanceof IdemgateError);
    assert.equal(e.verdict, 'unknown');
    assert.match(e.message, /transfer\/tr-1 is unknown/);
    assert.equal(typeof e.fence, 'number');
    assert.equal(runs, 1);
  });

  test('a return value JSON cannot hold makes the record unknown and throws TypeError', async () => {
    const engine = await STORES.memory();
    const f = idempotent(engine, 'nan', async () => Number.NaN, { key: () => 'nan-1' });
    await assert.rejects(f(), TypeError);
    await assert.rejects(f(), OutcomeUnknown);
  });
});

describe('keys and refusals', () => {
  test('the same key with other arguments is refused as KeyReused', async () => {
    const engine = await STORES.memory();
    const f = idempotent(engine, 'refund', async (amount) => amount, { key: () => 'refund-1' });
    assert.equal(await f(10), 10);
    await assert.rejects(f(11), KeyReused);
  });

  test('a write without key or window is refused as KeyRequired, and runs nothing', async () => {
    const engine = await STORES.memory();
    let runs = 0;
    const f = idempotent(engine, 'delete', async () => {
      runs += 1;
    });
    await assert.rejects(f('x'), KeyRequired);
    assert.equal(runs, 0);
  });

  test('within the window an identical call without key is the same action, in its scope only', async () => {
    const engine = await STORES.memory();
    let runs = 0;
    const f = idempotent(engine, 'post', async (text) => {
      runs += 1;
      return `posted ${text}`;
    }, { window: 60, scope: (_text, conversation) => conversation, args: (text) => ({ text }) });
    const first = await f.result('hi', 'conv-1');
    const again = await f.result('hi', 'conv-1');
    assert.equal(first.rule, 'fallback');
    assert.equal(again.replayed, true);
    await f('hi', 'conv-2');
    assert.equal(runs, 2);
  });

  test('identity fields make a reworded re-plan within the window the same action, and it says so', async () => {
    const engine = await STORES.memory();
    const sent = [];
    const mail = idempotent(engine, 'send_mail', async (to, subject, body) => {
      sent.push(body);
      return `sent to ${to}`;
    }, { window: 60, identity: ['to', '/subject'], scope: () => 'conv-1', args: (to, subject, body) => ({ to, subject, body }) });
    assert.equal(await mail('ann@x', 'Refund', 'Hello Ann, it is on its way.'), 'sent to ann@x');
    const replan = await mail.result('ann@x', 'Refund', 'Dear Ann, we have refunded you.');
    assert.equal(replan.replayed, true);
    assert.equal(replan.rule, 'fallback');
    assert.match(replan.forModel, /with the same to, \/subject \(the arguments that name it/);
    assert.equal(await mail('bob@x', 'Refund', 'Dear Ann, we have refunded you.'), 'sent to bob@x');
    assert.deepEqual(sent, ['Hello Ann, it is on its way.', 'Dear Ann, we have refunded you.']);
    await assert.rejects(
      idempotent(engine, 'x', async () => 1, { window: 60, identity: 'to' })(),
      /identity must be an array/,
    );
  });

  test('observe mode runs every call, tells the program what enforce would have done, and keeps it on the record', async () => {
    const engine = await STORES.memory();
    let runs = 0;
    const charge = idempotent(engine, 'charge', async (amount) => {
      runs += 1;
      return runs;
    }, { key: () => 'order-1', args: (amount) => ({ amount }), mode: 'observe' });
    const first = await charge.result(5);
    const again = await charge.result(5);
    const reused = await charge.result(6);
    assert.equal(first.executed, true);
    assert.equal(first.observed, undefined);
    assert.deepEqual([again.value, again.replayed, again.verdict, again.observed], [2, false, 'pass_through', 'replayed']);
    assert.deepEqual([reused.value, reused.observed], [3, 'key_reused']);
    const keyless = idempotent(engine, 'charge', async () => 'ran', { mode: 'observe' });
    assert.equal((await keyless.result()).observed, 'key_required');
    const record = await engine.record('charge', 'order-1');
    assert.equal(record.fence, 1);
    const observed = record.history.filter((s) => s.what === 'observed').map((s) => s.text);
    assert.equal(observed.length, 2);
    assert.match(observed[0], /enforce mode would have replayed the outcome recorded at/);
    // The function of an observed call sees its record's downstream key, as a run does.
    const seenKey = await engine.call('charge', 'order-1', { amount: 5 }, async () => currentKey(), { mode: 'observe' });
    assert.equal(seenKey.observed, 'replayed');
    assert.equal(seenKey.value, engine.keyFor('charge', 'order-1', { amount: 5 }).digest);
    // One word to enforce: the record observe mode kept is replayed.
    const enforced = idempotent(engine, 'charge', async () => 'never', { key: () => 'order-1', args: (amount) => ({ amount }) });
    assert.equal((await enforced.result(5)).replayed, true);
    await assert.rejects(
      idempotent(engine, 'x', async () => 1, { key: () => 'k', mode: 'shadow' })(),
      /unknown mode "shadow": expected enforce or observe/,
    );
  });

  test('observe mode observes a call id duplicate once, with the window of the same tool inside it', async () => {
    const engine = await STORES.memory();
    let sent = 0;
    const observe = { mode: 'observe' };
    // An adapter's shape: the call id's record, and inside its function the window's record of the
    // same tool; a call of another tool inside the function is observed on its own.
    const windowed = async () => {
      await engine.call('audit', 'audit-1', { n: 1 }, async () => 'noted', observe);
      const inner = await engine.call('mail', null, { to: 'ann' }, async () => (sent += 1), { scope: 'call-1', window: 60, ...observe });
      return inner.value;
    };
    const first = await engine.call('mail', 'call-1', { to: 'ann' }, windowed, { scope: 'call-1', ...observe });
    const again = await engine.call('mail', 'call-1', { to: 'ann' }, windowed, { scope: 'call-1', ...observe });
    assert.equal(first.observed, undefined);
    assert.equal(again.observed, 'replayed');
    assert.equal(sent, 2);
    const count = (record) => record.history.filter((s) => s.what === 'observed').length;
    assert.equal(count(await engine.record('mail', 'call-1')), 1);
    const window = engine.keyFor('mail', null, { to: 'ann' }, { scope: 'call-1', window: 60 });
    assert.equal(count(await engine.record('mail', window.key)), 0);
    assert.equal(count(await engine.record('audit', 'audit-1')), 1);
  });

  test('result() tells a replay from a run without changing what the wrapper returns', async () => {
    const engine = await STORES.memory();
    const f = idempotent(engine, 'tag', async () => ['a', 1], { key: () => 'tag-1' });
    const run = await f.result();
    assert.equal(run.executed, true);
    assert.equal(run.replayed, false);
    assert.equal(run.verdict, 'executed');
    assert.ok(run.executedAt instanceof Date);
    const replay = await f.result();
    assert.equal(replay.replayed, true);
    assert.equal(replay.executedAt.getTime(), run.executedAt.getTime());
    assert.deepEqual(await f(), ['a', 1]);
  });

  test('the function sees the record digest as currentKey', async () => {
    const engine = await STORES.memory();
    const f = idempotent(engine, 'digest', async () => currentKey(), { key: () => 'd-1' });
    const key = await f();
    assert.match(key, /^[0-9a-f]{64}$/);
    assert.equal(key, engine.keyFor('digest', 'd-1', { args: [], kwargs: {} }).digest);
    assert.throws(() => currentKey(), /only known inside/);
  });

  test('a read passes through: it runs every time and nothing is recorded', async () => {
    const engine = await STORES.memory();
    let runs = 0;
    const f = idempotent(engine, 'lookup', async () => ++runs, { kind: 'read' });
    assert.equal(await f(), 1);
    assert.equal(await f(), 2);
    assert.equal((await f.result()).verdict, 'pass_through');
  });

  test('a duplicate that outwaits its bound gets InFlight', async () => {
    const engine = await STORES.memory();
    const release = deferred();
    const started = deferred();
    const f = idempotent(engine, 'slow', async () => {
      started.resolve();
      await release.promise;
      return 'done';
    }, { key: () => 'slow-1', wait: 0 });
    const first = f();
    await within(started.promise, 'the first call to start');
    const e = await f().catch((err) => err);
    assert.ok(e instanceof InFlight, String(e));
    assert.equal(typeof e.retryAfter, 'number');
    release.resolve();
    assert.equal(await first, 'done');
  });

  test('a derived key is the Python package derive_key', () => {
    // idemgate._native.derive_key("run-1", "step-1"), computed by the Python package.
    assert.equal(deriveKey('run-1', 'step-1'), deriveKey('run-1', 'step-1'));
    assert.notEqual(deriveKey('ab', 'c'), deriveKey('a', 'bc'));
  });
});

describe('cancellation by AbortSignal', () => {
  test('aborting while the function runs stops the wait, and the outcome is still recorded', async () => {
    const engine = await STORES.sqlite();
    const controller = new AbortController();
    const release = deferred();
    const started = deferred();
    const finished = deferred();
    let runs = 0;
    const f = idempotent(engine, 'export', async () => {
      runs += 1;
      started.resolve();
      await release.promise;
      finished.resolve();
      return 'exported';
    }, { key: () => 'exp-1', signal: () => controller.signal, wait: 60 });
    const call = f();
    await within(started.promise, 'the function to start');
    controller.abort(new Error('the user gave up'));
    // The caller hears at once, while the function is still running (released only below).
    await assert.rejects(within(call, 'the caller to stop waiting'), /the user gave up/);
    release.resolve();
    await within(finished.promise, 'the function to finish');
    // The retry with the same key waits for the recording if need be, then replays it.
    const retry = await idempotent(engine, 'export', async () => 'ran again', { key: () => 'exp-1', wait: 60 }).result();
    assert.equal(retry.replayed, true);
    assert.equal(retry.value, 'exported');
    assert.equal(runs, 1);
  });

  test('a signal aborted before the call runs nothing and reserves nothing', async () => {
    const engine = await STORES.memory();
    let runs = 0;
    const controller = new AbortController();
    controller.abort(new Error('too late'));
    await assert.rejects(engine.call('ship', 'ship-2', null, async () => ++runs, { signal: controller.signal }), /too late/);
    assert.equal(await engine.recordState('ship', 'ship-2'), null);
    assert.equal(runs, 0);
  });
});

describe('opening a store', () => {
  test('a misspelt scheme is StoreMisconfigured, an unreachable server StoreUnavailable', async () => {
    await assert.rejects(Engine.open('sqlit:///tmp/x.db'), StoreMisconfigured);
    const e = await Engine.open('postgres://u:secret@127.0.0.1:1/db', { journal: sqliteStore().journal }).catch((err) => err);
    assert.ok(e instanceof StoreUnavailable, String(e));
    assert.doesNotMatch(e.message, /secret/);
  });
});

test('every verdict that is an error has its error class', () => {
  const native = require('../native.cjs');
  const { CLASSES } = require('../errors.cjs');
  const labels = native.verdictLabels();
  assert.ok(labels.length > 10);
  for (const [label, isError] of labels) {
    if (isError === 'true') assert.ok(CLASSES[label], `no error class for the verdict ${label}`);
    else assert.equal(CLASSES[label], undefined, `${label} is a result, not an error`);
  }
});

test('the CommonJS and ESM entry points share one engine and one set of error classes', async () => {
  const cjs = require('idemgate');
  const esm = await import('idemgate');
  assert.equal(cjs.Engine, esm.Engine);
  assert.equal(cjs.OutcomeUnknown, esm.OutcomeUnknown);
  const engine = await cjs.Engine.open('memory:', { tenant: unique('t') });
  const f = esm.idempotent(engine, 'mixed', async () => {
    throw new cjs.MaybeApplied('half done');
  }, { key: () => 'mixed-1' });
  await assert.rejects(f(), esm.MaybeApplied);
  await assert.rejects(f(), OutcomeUnknown);
});
