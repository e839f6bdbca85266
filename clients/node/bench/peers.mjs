// idemgate beside the Node peers, each on the store it is made for, in one run: Powertools for
// TypeScript's idempotency utility (`@aws-lambda-powertools/idempotency` with its cache
// persistence layer) on Redis, and `@node-idempotency/core` with its in-memory adapter; idemgate
// on the same Redis and in memory (equal durability), SQLite as an extra row; and the floor on
// Redis: the client's own round trips with no library (a fresh call `SET NX GET`, then `SET XX`
// with the result; a duplicate the one `SET NX GET`, which hands back the stored result). Never a
// test.
//
// - fresh and replay: µs per call of a function made idempotent, calls one after another, for a
//   first call (a fresh key: reserve, run, record) and for a duplicate (the stored result);
// - storm: a barrier before every key: CALLERS calls of one key start at once while its function
//   runs (1 ms), KEYS keys one after another; calls/s, how many of the losers got the winner's
//   result (the rest were refused or failed), executions beyond one per key, and how long after
//   the winner's answer each loser got its own (p50/p99/max over all rounds).
// Medians over ROUNDS rounds with min–max, the libraries interleaved within each round (each round
// starts one system later, so that none always runs first). Then each idemgate row's speed against
// its peer on the same store and against the floor, paired by round (the other's µs per call over
// idemgate's, round by round: above 1 idemgate is faster). The header says when, on how many cores,
// at what load average, and what the Redis server keeps (its append-only file and fsync policy).
//
// Usage: scripts/bench-node (a release addon, private Redis, load; see its --help), or from
// clients/node after scripts/test-node --build-only, with IDEMGATE_NODE_ADDON naming a release
// build of the addon:
//   node bench/peers.mjs [calls per round, default 300] [rounds, default 5] [storm keys, default 100]
//   IDEMGATE_TEST_REDIS_URL (default redis://127.0.0.1:6379); keys have a prefix of their own;
//   a server that keeps nothing (no append-only file) is used with idemgate's allow_volatile;
//   BENCH_LOAD=<n> says in the header that n busy processes run beside (scripts/bench-node --load);
//   BENCH_ONE_CORE=1 says that Node and Redis share one core (scripts/bench-node --one-core);
//   BENCH_ONLY=<regex> times only the systems whose name matches (the baseline always runs).
//   IDEMGATE_NODE_WORKER_THREADS sets the addon's runtime workers (default 1).
import { mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { createClient } from '@redis/client';
import { Engine } from '../index.mjs';
import { nodeIdempotency, ours, powertools, redisFloor } from './systems.mjs';

const CALLS = Number(process.argv[2] ?? 300);
const ROUNDS = Number(process.argv[3] ?? 5);
const KEYS = Number(process.argv[4] ?? 100);
const CALLERS = 16;
const REDIS = process.env.IDEMGATE_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const LOAD = Number(process.env.BENCH_LOAD ?? 0);
const run = randomBytes(4).toString('hex');

const work = async (order) => ({ charged: order.amount, order: order.id });

const redis = await createClient({ url: REDIS }).connect();
// What the server keeps, for the header; one that keeps nothing needs idemgate's allow_volatile.
const kept = await redis.configGet('append*');
const durable = kept.appendonly === 'yes';
const durability = durable ? `append-only file, appendfsync ${kept.appendfsync}` : 'no append-only file (keeps nothing)';
const dir = mkdtempSync(path.join(tmpdir(), 'idemgate-bench-'));
const tenant = `bench-${run}`;
const engines = {
  memory: await Engine.open('memory:', { tenant }),
  sqlite: await Engine.open(`sqlite://${path.join(dir, 'db')}`, { journal: path.join(dir, 'journal'), tenant }),
  redis: await Engine.open(`${REDIS}?key_prefix=bench-${run}:${durable ? '' : '&allow_volatile=true'}`, { journal: path.join(dir, 'journal-r'), tenant }),
};
/** The systems' wrappers (bench/systems.mjs), on this run's stores and key prefixes. */
const wrapPowertools = powertools(redis, `bench-${run}-pt`);
const floor = redisFloor(redis, `bench-${run}-floor`);

/** Each system: how it wraps a function, and the store it is compared on. */
const systems = {
  'baseline (the bare function)': { wrap: (fn) => fn, store: '-' },
  '@node-idempotency/core, memory': { wrap: nodeIdempotency, store: 'memory' },
  'idemgate, memory': { wrap: ours(engines.memory), store: 'memory' },
  'powertools idempotency, Redis': { wrap: wrapPowertools, store: 'Redis' },
  'idemgate, Redis': { wrap: ours(engines.redis), store: 'Redis' },
  'idemgate, SQLite': { wrap: ours(engines.sqlite), store: 'SQLite' },
  'the floor (SET NX GET, SET XX)': { wrap: floor, store: 'Redis', noStorm: true },
};
/** Each idemgate row's speed is paired, round by round, with these systems' on its store. */
const pairs = [
  ['idemgate, memory', '@node-idempotency/core, memory'],
  ['idemgate, Redis', 'powertools idempotency, Redis'],
  ['idemgate, Redis', 'the floor (SET NX GET, SET XX)'],
];

const only = process.env.BENCH_ONLY ? new RegExp(process.env.BENCH_ONLY) : null;
for (const name of Object.keys(systems)) {
  if (only && !name.startsWith('baseline') && !only.test(name)) delete systems[name];
}

/** µs per call of `f` over `CALLS` fresh orders, then over the same orders again. */
async function freshAndReplay(f, label) {
  const orders = Array.from({ length: CALLS }, (_, i) => ({ id: `${run}-${label}-${i}`, amount: i }));
  const t0 = performance.now();
  for (const o of orders) await f(o);
  const fresh = ((performance.now() - t0) * 1000) / CALLS;
  const t1 = performance.now();
  for (const o of orders) await f(o);
  return { fresh, replay: ((performance.now() - t1) * 1000) / CALLS };
}

/** The storm on `wrap`: calls/s, losers with the winner's result, extra executions, lateness. */
async function storm(wrap, label) {
  const runs = new Map();
  const f = wrap(async (order) => {
    runs.set(order.id, (runs.get(order.id) ?? 0) + 1);
    await sleep(1);
    return { charged: order.amount, order: order.id };
  });
  let answered = 0;
  const late = [];
  const t0 = performance.now();
  for (let k = 0; k < KEYS; k++) {
    const order = { id: `${run}-${label}-${k}`, amount: k };
    const done = await Promise.all(Array.from({ length: CALLERS }, () => f(order).then(
      (v) => ({ ok: v?.order === order.id, at: performance.now() }),
      () => ({ ok: false, at: performance.now() }),
    )));
    const first = Math.min(...done.map((d) => d.at));
    for (const d of done) {
      if (d.ok) answered += 1;
      if (d.at !== first) late.push(d.at - first);
    }
  }
  const seconds = (performance.now() - t0) / 1000;
  const extra = [...runs.values()].reduce((n, r) => n + r - 1, 0);
  return { perSecond: (KEYS * CALLERS) / seconds, losersAnswered: answered - KEYS, extra, late };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))] ?? 0;
const show = (xs, d = 1) => !xs.length ? '-' : `${median(xs).toFixed(d)} (${Math.min(...xs).toFixed(d)}–${Math.max(...xs).toFixed(d)})`;

const loadNote = () => {
  const [one, five] = loadavg();
  return `load average ${one.toFixed(1)} (5 min: ${five.toFixed(1)})`;
};
console.log(`${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC, ${availableParallelism()} cores, ` +
  `${loadNote()}${LOAD ? `, ${LOAD} busy processes beside` : ''}; ` +
  `${process.env.BENCH_ONE_CORE ? 'Node and Redis on the first core only; ' : ''}Redis ${REDIS} (${durability}); ` +
  `addon ${process.env.IDEMGATE_NODE_ADDON ?? '(the package\'s own)'}`);

const results = Object.fromEntries(Object.keys(systems).map((k) => [k, { fresh: [], replay: [], storm: [], answered: [], extra: [], late: [] }]));
const order = Object.entries(systems);
for (let r = 0; r < ROUNDS; r++) {
  for (let i = 0; i < order.length; i++) {
    const [name, { wrap, noStorm }] = order[(i + r) % order.length];
    const label = `${name.replace(/\W+/g, '_')}-${r}`;
    const { fresh, replay } = await freshAndReplay(wrap(work), label);
    const out = results[name];
    out.fresh.push(fresh);
    out.replay.push(replay);
    if (noStorm) continue;
    const s = await storm(wrap, `${label}-storm`);
    out.storm.push(s.perSecond);
    out.answered.push(s.losersAnswered);
    out.extra.push(s.extra);
    out.late.push(...s.late);
  }
}
const losers = KEYS * (CALLERS - 1);
console.log(`node ${process.version}; ${CALLS} calls a round for fresh and replay; storm: ${KEYS} keys × ${CALLERS} callers ` +
  `(1 ms function); ${ROUNDS} rounds; medians (min–max)`);
console.log('| system | store | fresh µs/call | replay µs/call | storm calls/s | losers with the result (of ' +
  `${losers}) | extra runs | losers late p50 / p99 / max ms |`);
console.log('|---|---|---:|---:|---:|---:|---:|---|');
for (const [name, r] of Object.entries(results)) {
  const l = r.late;
  console.log(`| ${name} | ${systems[name].store} | ${show(r.fresh)} | ${show(r.replay)} | ${show(r.storm, 0)} | ` +
    `${show(r.answered, 0)} | ${show(r.extra, 0)} | ${l.length ? `${pct(l, 50).toFixed(2)} / ${pct(l, 99).toFixed(2)} / ${Math.max(...l).toFixed(2)}` : '-'} |`);
}
const paired = pairs.filter(([a, b]) => results[a] && results[b]);
if (paired.length) {
  console.log('\n| idemgate | against | fresh: speed × (paired) | replay: speed × (paired) |');
  console.log('|---|---|---:|---:|');
  const speed = (a, b, what) => show(results[a][what].map((ours, i) => results[b][what][i] / ours), 2);
  for (const [a, b] of paired) console.log(`| ${a} | ${b} | ${speed(a, b, 'fresh')} | ${speed(a, b, 'replay')} |`);
}
console.log(`\n(done: ${loadNote()})`);
for (const e of Object.values(engines)) e.close();
await redis.quit();
rmSync(dir, { recursive: true, force: true });
