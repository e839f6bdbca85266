// What one duplicate costs inside the addon, the memory store's replay through `begin` alone,
// beside smaller calls across the same boundary: the cheapest call (deriveKey), a record read
// (recordState) and naming a record with its fingerprint (keyFor). µs per call, medians of 5
// rounds (min–max). Never a test.
//
// Usage (from clients/node): node bench/addon.mjs [calls per round, default 50000]
//   IDEMGATE_NODE_ADDON names a release build (see bench/peers.mjs).
import { performance } from 'node:perf_hooks';
import { createRequire } from 'node:module';

const native = createRequire(import.meta.url)('../native.cjs');
const CALLS = Number(process.argv[2] ?? 50_000);
const n = await native.openEngine('memory:', null, 'bench');
const call = ['charge', 'o-1', JSON.stringify({ id: 'o-1', amount: 3 })]; // tool, key, arguments
const { execute } = JSON.parse(n.begin(...call));
n.finish(execute, 'success', '{"charged":3,"order":"o-1"}');

const cases = {
  'deriveKey (the smallest call)': () => native.deriveKey('run', 'step'),
  'recordState (a record read)': () => n.recordState('charge', 'o-1'),
  'keyFor (name + fingerprint)': () => n.keyFor(...call),
  'begin, a replay (the whole duplicate)': () => n.begin(...call),
};
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log(`node ${process.version}, ${CALLS} calls a round, 5 rounds: µs per call, median (min–max)`);
for (const [name, f] of Object.entries(cases)) {
  const rounds = [];
  for (let r = 0; r < 5; r++) {
    const t = performance.now();
    for (let i = 0; i < CALLS; i++) f();
    rounds.push(((performance.now() - t) * 1000) / CALLS);
  }
  console.log(`${name.padEnd(40)} ${median(rounds).toFixed(2)} (${Math.min(...rounds).toFixed(2)}–${Math.max(...rounds).toFixed(2)})`);
}
n.close();
