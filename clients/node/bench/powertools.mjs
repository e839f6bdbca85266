// A benchmark beside @aws-lambda-powertools/idempotency (pinned in package.json), both on the
// same Redis: the time per call of a function made idempotent, for a first call (a fresh key:
// reserve, run, record) and for a duplicate (the stored result replayed), calls one after
// another. Medians over ROUNDS rounds, with min–max; a baseline of the same run (the bare
// function) first. idemgate's memory and SQLite stores are extra rows. Never a test.
//
// Usage (from clients/node, after scripts/test-node --build-only):
//   node bench/powertools.mjs [calls per round, default 300] [rounds, default 5]
//   IDEMGATE_TEST_REDIS_URL (default redis://127.0.0.1:6379); keys have a prefix of their own.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { createClient } from '@redis/client';
import { makeIdempotent, IdempotencyConfig } from '@aws-lambda-powertools/idempotency';
import { CachePersistenceLayer } from '@aws-lambda-powertools/idempotency/cache';
import { Engine, idempotent } from '../index.mjs';

const CALLS = Number(process.argv[2] ?? 300);
const ROUNDS = Number(process.argv[3] ?? 5);
const REDIS = process.env.IDEMGATE_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const run = randomBytes(4).toString('hex');

const work = async (order) => ({ charged: order.amount, order: order.id });

/** µs per call of `f` over `CALLS` orders of round `r` (ids fresh per round unless `same`). */
async function timed(f, r, label) {
  const orders = Array.from({ length: CALLS }, (_, i) => ({ id: `${run}-${label}-${r}-${i}`, amount: i }));
  const t0 = performance.now();
  for (const o of orders) await f(o);
  const first = ((performance.now() - t0) * 1000) / CALLS;
  const t1 = performance.now();
  for (const o of orders) await f(o);
  const replay = ((performance.now() - t1) * 1000) / CALLS;
  return { first, replay };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const show = (xs) => `${median(xs).toFixed(1).padStart(8)} (${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)})`;

const redis = await createClient({ url: REDIS }).connect();
const dir = mkdtempSync(path.join(tmpdir(), 'idemgate-bench-'));
const engines = {
  memory: await Engine.open('memory:', { tenant: `bench-${run}` }),
  sqlite: await Engine.open(`sqlite://${path.join(dir, 'db')}`, { journal: path.join(dir, 'journal'), tenant: `bench-${run}` }),
  redis: await Engine.open(`${REDIS}?key_prefix=bench-${run}:&allow_volatile=true`, { journal: path.join(dir, 'journal-r'), tenant: `bench-${run}` }),
};
// Outside Lambda there is no invocation deadline: a context that has ample time left, as a
// Lambda's would, so Powertools does not warn on every call.
const powertoolsConfig = new IdempotencyConfig({ eventKeyJmesPath: 'id' });
powertoolsConfig.registerLambdaContext({ getRemainingTimeInMillis: () => 900_000 });
const systems = {
  'baseline (the bare function)': work,
  'powertools idempotency, Redis': makeIdempotent(work, {
    persistenceStore: new CachePersistenceLayer({ client: redis }),
    config: powertoolsConfig,
  }),
  'idemgate, Redis': idempotent(engines.redis, 'charge', work, { key: (o) => o.id, args: (o) => o }),
  'idemgate, SQLite': idempotent(engines.sqlite, 'charge', work, { key: (o) => o.id, args: (o) => o }),
  'idemgate, memory': idempotent(engines.memory, 'charge', work, { key: (o) => o.id, args: (o) => o }),
};

const results = Object.fromEntries(Object.keys(systems).map((k) => [k, { first: [], replay: [] }]));
for (let r = 0; r < ROUNDS; r++) {
  for (const [name, f] of Object.entries(systems)) {
    const { first, replay } = await timed(f, r, name.replace(/\W+/g, '_'));
    results[name].first.push(first);
    results[name].replay.push(replay);
  }
}
console.log(`${CALLS} calls a round, ${ROUNDS} rounds, node ${process.version}: µs per call, median (min–max)`);
console.log(`${'system'.padEnd(32)} ${'first call'.padStart(24)} ${'duplicate'.padStart(24)}`);
for (const [name, r] of Object.entries(results)) console.log(`${name.padEnd(32)} ${show(r.first).padStart(24)} ${show(r.replay).padStart(24)}`);
for (const e of Object.values(engines)) e.close();
await redis.quit();
