// One system's calls one after another, nothing else, for counting what a call costs from
// outside: run it under `strace -f -c` or `perf stat` at two call counts and divide the
// difference by the difference of the counts (what the process does to start and open its store
// cancels out). The systems are bench/peers.mjs's (bench/systems.mjs), on the same stores.
// Never a test.
//
// Usage (from clients/node, after scripts/test-node --build-only; IDEMGATE_NODE_ADDON as for
// bench/peers.mjs):
//   node bench/calls.mjs <system> <fresh|replay> <calls>
//   system: idemgate-memory, node-idempotency-memory, idemgate-redis, powertools-redis,
//     floor-redis (bench/peers.mjs's floor: SET NX GET, then SET XX)
//   IDEMGATE_TEST_REDIS_URL (default redis://127.0.0.1:6379); keys have a prefix of their own.
//   On Redis it also prints the server's CPU time per call (meaningful on a private server).
//   `taskset -c 0` on Node and on a private server times the work alone, with no wake-up of an
//   idle core between them (see scripts/bench-node --one-core).
// e.g. for n in 1000 3000; do strace -f -c -o /tmp/s.$n node bench/calls.mjs idemgate-redis fresh $n; done
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';

const [system, phase, count] = process.argv.slice(2);
const CALLS = Number(count ?? 1000);
const REDIS = process.env.IDEMGATE_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';
const run = randomBytes(4).toString('hex');
const work = async (order) => ({ charged: order.amount, order: order.id });

const { nodeIdempotency, ours, powertools, redisFloor } = await import('./systems.mjs');
let wrapped;
let close = async () => {};
if (system.startsWith('idemgate-')) {
  const { Engine } = await import('../index.mjs');
  const dir = mkdtempSync(path.join(tmpdir(), 'idemgate-calls-'));
  const url = system === 'idemgate-memory' ? 'memory:' : `${REDIS}?key_prefix=calls-${run}:&allow_volatile=true`;
  const engine = await Engine.open(url, { journal: path.join(dir, 'journal'), tenant: `calls-${run}` });
  wrapped = ours(engine)(work);
  close = async () => engine.close();
} else if (system === 'node-idempotency-memory') {
  wrapped = nodeIdempotency(work);
} else if (system === 'powertools-redis' || system === 'floor-redis') {
  const { createClient } = await import('@redis/client');
  const redis = await createClient({ url: REDIS }).connect();
  const wrap = system === 'floor-redis' ? redisFloor(redis, `calls-${run}-floor`) : powertools(redis, `calls-${run}-pt`);
  wrapped = wrap(work);
  close = async () => redis.quit();
} else {
  throw new Error(`unknown system ${system}`);
}

// On Redis, the server's own CPU time per call as well (`INFO cpu`, read over a connection of
// its own before and after the timed calls): on a server nothing else uses (a private one),
// what the library's commands cost Redis.
let serverCpu = async () => undefined;
if (system.endsWith('-redis')) {
  const { createClient } = await import('@redis/client');
  const probe = await createClient({ url: REDIS }).connect();
  serverCpu = async () => {
    const info = await probe.info('cpu');
    const field = (name) => Number(new RegExp(`^${name}:([0-9.]+)`, 'm').exec(info)[1]);
    return field('used_cpu_user') + field('used_cpu_sys');
  };
  const previous = close;
  close = async () => {
    await previous();
    await probe.quit();
  };
}

const orders = Array.from({ length: CALLS }, (_, i) => ({ id: `${run}-${i}`, amount: i }));
if (phase === 'replay') for (const o of orders) await wrapped(o);
const cpu0 = await serverCpu();
const t = performance.now();
for (const o of orders) await wrapped(o);
const us = ((performance.now() - t) * 1000) / CALLS;
const cpu1 = await serverCpu();
const server = cpu0 === undefined ? '' : `; Redis server CPU ${(((cpu1 - cpu0) * 1e6) / CALLS).toFixed(1)} µs/call`;
process.stderr.write(`${system} ${phase}: ${CALLS} calls, ${us.toFixed(1)} µs/call${server}\n`);
await close();
