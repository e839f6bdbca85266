// The Redis connection Node's own loop carries (carried.cjs): calls go through it, and when it
// breaks (a reply lost after the command ran, a reply that never comes, the server gone) no call
// runs its function twice, the caller is told, and the link comes back. Between the engine and
// the test's Redis sits a proxy the test steers, so a fault lands on one command.
import { test, describe, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { spawn } from 'node:child_process';
import v8 from 'node:v8';
import vm from 'node:vm';
import { fileURLToPath } from 'node:url';
import { Engine, idempotent, IdemgateError, StoreUnavailable } from '../index.mjs';
import { unique, sqliteStore, within, REDIS_URL } from './helpers.mjs';

const upstream = new URL(REDIS_URL);

/** A proxy to the test's Redis. `cut(marker, how)` arms a fault on the next command whose bytes
 * contain `marker`: `'after'` forwards it and drops its reply, closing the client's connection
 * (the command ran, its answer is lost); `'hold'` forwards it and never answers. `connections`
 * lists every client connection with the first bytes it sent. */
async function proxy() {
  const connections = [];
  let armed = null;
  const server = net.createServer((client) => {
    const conn = { first: null, commands: 0, closed: false, client };
    connections.push(conn);
    const redis = net.connect(Number(upstream.port || 6379), upstream.hostname);
    let dropReplies = false;
    let hold = false;
    const close = () => {
      conn.closed = true;
      client.destroy();
      redis.destroy();
    };
    client.on('data', (chunk) => {
      const text = chunk.toString('latin1');
      conn.first ??= text;
      conn.commands += (text.match(/^\*/gm) ?? []).length;
      if (armed && text.includes(armed.marker)) {
        const { how, hit } = armed;
        armed = null;
        if (how === 'after') dropReplies = true;
        if (how === 'hold') hold = true;
        hit(conn);
      }
      redis.write(chunk);
    });
    redis.on('data', (chunk) => {
      if (dropReplies) close();
      else if (!hold) client.write(chunk);
    });
    client.on('error', close);
    client.on('close', close);
    redis.on('error', close);
    redis.on('close', close);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: (prefix, db = '') => `redis://127.0.0.1:${server.address().port}/${db}?key_prefix=${prefix}:&allow_volatile=true`,
    connections,
    /** The connections Node's loop carries: the engine's own connections begin with redis-rs's
     * `CLIENT SETINFO`; the carried link sends its setup or its first call's command first. */
    carried: () => connections.filter(isCarried),
    cut(marker, how) {
      return new Promise((hit) => {
        armed = { marker, how, hit };
      });
    },
    close() {
      for (const c of connections) c.client.destroy();
      server.close();
    },
  };
}

const isCarried = (c) => c.first !== null && !c.first.includes('SETINFO');

const proxies = [];
after(() => proxies.forEach((p) => p.close()));

async function engineBehindProxy(db = '') {
  const p = await proxy();
  proxies.push(p);
  const prefix = unique('carried');
  const tenant = unique('t');
  const engine = await Engine.open(p.url(prefix, db), { journal: sqliteStore().journal, tenant });
  return { p, engine, prefix, tenant };
}

/** Calls `f` until `ready()` holds, within a generous deadline. */
async function until(ready, what, f = async () => {}) {
  await within((async () => {
    while (!ready()) {
      await f();
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  })(), what);
}

describe('the Redis connection Node\'s loop carries', () => {
  test('carries the calls: one connection of the loop\'s own takes their commands', async () => {
    const { p, engine } = await engineBehindProxy();
    let runs = 0;
    const charge = idempotent(engine, 'charge', async (n) => {
      runs += 1;
      return { n };
    }, { key: (n) => `order-${n}` });
    for (let n = 0; n < 20; n++) await charge(n);
    for (let n = 0; n < 20; n++) assert.deepEqual(await charge(n), { n });
    assert.equal(runs, 20);
    const carried = p.carried();
    assert.equal(carried.length, 1, 'one carried connection');
    // A fresh call is two commands (reserve, complete); the duplicates may be answered from the
    // engine's cache, so at least the fresh calls' commands went through it.
    assert.ok(carried[0].commands >= 40, `the carried connection took ${carried[0].commands} commands`);
    engine.close();
  });

  test('carries many calls at once, racing duplicates among them, each run once', async () => {
    const { p, engine } = await engineBehindProxy();
    const runs = new Map();
    const charge = idempotent(engine, 'charge', async (n) => {
      runs.set(n, (runs.get(n) ?? 0) + 1);
      await new Promise((resolve) => setImmediate(resolve));
      return { n };
    }, { key: (n) => `order-${n}`, wait: 60 });
    // 50 keys at once, each called three times in the same turn of the loop.
    const calls = [];
    for (let n = 0; n < 50; n++) for (let i = 0; i < 3; i++) calls.push(charge.result(n));
    const results = await within(Promise.all(calls), 'every call to answer');
    for (let n = 0; n < 50; n++) {
      assert.equal(runs.get(n), 1, `key ${n} ran once`);
      const mine = results.slice(n * 3, n * 3 + 3);
      assert.equal(mine.filter((r) => r.executed).length, 1);
      for (const r of mine) assert.deepEqual(r.value, { n });
    }
    assert.equal(p.carried().length, 1);
    assert.ok(p.carried()[0].commands >= 100, 'the carried connection took the reservations and completions');
    engine.close();
  });

  test('sets its connection up as the URL says: the database it names', async () => {
    const { p, engine, prefix, tenant } = await engineBehindProxy('3');
    const f = idempotent(engine, 'f', async () => 'stored in 3', { key: () => 'k' });
    assert.equal(await f(), 'stored in 3');
    const [carried] = p.carried();
    assert.match(carried.first, /SELECT/, 'the setup goes first');
    // Another engine straight on database 3 finds the record; one on database 0 does not.
    const journal = sqliteStore().journal;
    const in3 = await Engine.open(`${REDIS_URL}/3?key_prefix=${prefix}:&allow_volatile=true`, { journal, tenant });
    const in0 = await Engine.open(`${REDIS_URL}/0?key_prefix=${prefix}:&allow_volatile=true`, { journal, tenant });
    assert.equal((await in3.recordState('f', 'k'))?.state, 'completed');
    assert.equal(await in0.recordState('f', 'k'), null);
    for (const e of [engine, in3, in0]) e.close();
  });

  test('a reservation whose reply is lost never runs the function, and the retry runs it once', async () => {
    const { p, engine } = await engineBehindProxy();
    let runs = 0;
    const key = unique('pay');
    const pay = idempotent(engine, 'pay', async () => {
      runs += 1;
      return 'paid';
    }, { key: () => key, lease: 1, wait: 0 });
    const hit = p.cut(key, 'after');
    const first = await pay.result().then((r) => r, (e) => e);
    const conn = await within(hit, 'the reservation to reach redis');
    assert.ok(isCarried(conn), 'the reservation went over the carried connection');
    assert.ok(first instanceof StoreUnavailable, `told the store's answer was lost: ${first}`);
    assert.match(first.message, /nothing ran/);
    assert.equal(runs, 0, 'a reservation whose answer was lost never runs the function');
    // The engine took its reservation back before it answered (it said nothing ran), so the
    // next call runs the function, once, and the ones after it replay.
    const retries = [];
    for (let i = 0; i < 3; i++) retries.push(await pay.result());
    assert.deepEqual(retries.map((r) => r.verdict), ['executed', 'replayed', 'replayed']);
    assert.equal(runs, 1);
    engine.close();
  });

  test('a completion whose reply is lost is told, and a duplicate replays it rather than running again', async () => {
    const { p, engine } = await engineBehindProxy();
    let runs = 0;
    const marker = unique('receipt');
    const send = idempotent(engine, 'send', async () => {
      runs += 1;
      return { receipt: marker };
    }, { key: () => 'mail-1' });
    const hit = p.cut(marker, 'after');
    const first = await send.result().then((r) => r, (e) => e);
    const conn = await within(hit, 'the completion to reach redis');
    assert.ok(isCarried(conn), 'the completion went over the carried connection');
    assert.equal(runs, 1);
    if (first instanceof Error) {
      assert.ok(first instanceof IdemgateError, `told with an idemgate error, not ${first}`);
    } else {
      // The engine confirmed the completion another way (its retry, the journal): it says how.
      assert.equal(first.executed, true);
      assert.ok(['stored', 'journaled'].includes(first.recording), first.recording);
    }
    const again = await send.result();
    assert.equal(again.replayed, true, 'the duplicate gets the stored outcome');
    assert.deepEqual(again.value, { receipt: marker });
    assert.equal(runs, 1, 'never a second run');
    engine.close();
  });

  test('a reply that never comes fails the call after the response timeout; the loop connects again', async () => {
    const { p, engine } = await engineBehindProxy();
    let runs = 0;
    const key = unique('ticket');
    const open = idempotent(engine, 'open_ticket', async (k) => {
      runs += 1;
      return `opened ${k}`;
    }, { key: (k) => k, lease: 1, wait: 0 });
    const hit = p.cut(key, 'hold');
    const held = await within(open.result(key).then((r) => r, (e) => e), 'the held call to be given up', 30_000);
    const heldConn = await within(hit, 'the held command to reach redis');
    assert.ok(isCarried(heldConn), 'the held command went over the carried connection');
    assert.ok(held instanceof IdemgateError, `the held call is told: ${held}`);
    assert.match(held.message, /no reply from redis within 5000 ms/, 'after the store\'s response timeout');
    assert.equal(runs, 0, 'and its function never ran');
    // Calls go on meanwhile, and the loop connects a new socket within a second or so.
    let n = 0;
    const fresh = () => p.carried().find((c) => c !== heldConn && !c.closed);
    await until(() => fresh() !== undefined, 'a new carried connection', async () => {
      assert.equal(await open(`later-${(n += 1)}`), `opened later-${n}`);
    });
    assert.equal(runs, n);
    const before = fresh().commands;
    assert.equal(await open('on-the-new-link'), 'opened on-the-new-link');
    assert.ok(fresh().commands > before, 'the new link carries the calls');
    engine.close();
  });

  test('an engine dropped without close() is collected, its connections with it', async () => {
    const p = await proxy();
    proxies.push(p);
    await (async () => {
      const engine = await Engine.open(p.url(unique('dropped')), { journal: sqliteStore().journal, tenant: unique('t') });
      const f = idempotent(engine, 'f', async () => 'done', { key: () => 'k' });
      assert.equal(await f(), 'done');
    })();
    assert.equal(p.carried().length, 1);
    // The engine, its native half and its sockets go once nothing holds them: collect until the
    // proxy sees every connection closed, within a generous deadline.
    v8.setFlagsFromString('--expose-gc');
    const gc = vm.runInNewContext('gc');
    await until(() => p.connections.every((c) => c.closed), 'the dropped engine\'s connections to close', async () => {
      gc();
    });
  });

  test('an engine with a connected link keeps no process alive once its calls are done', async () => {
    const script = `
      import { Engine, idempotent } from ${JSON.stringify(new URL('../index.mjs', import.meta.url).href)};
      const engine = await Engine.open(${JSON.stringify(`${REDIS_URL}?key_prefix=${unique('exit')}:&allow_volatile=true`)},
        { journal: ${JSON.stringify(sqliteStore().journal)}, tenant: 'exit' });
      const f = idempotent(engine, 'f', async () => 'done', { key: () => 'k' });
      console.log(await f());
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      cwd: fileURLToPath(new URL('..', import.meta.url)),
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
    });
    const code = await within(new Promise((resolve) => child.on('exit', resolve)), 'the process to exit by itself', 30_000)
      .catch((e) => {
        child.kill('SIGKILL');
        throw e;
      });
    assert.equal(code, 0);
    assert.equal(out.trim(), 'done');
  });
});
