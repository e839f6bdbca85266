// How each system of the Node benches makes a function idempotent, one definition for
// bench/peers.mjs and bench/calls.mjs, so that both time the same thing. Each takes the order
// (`{ id, amount }`) the benches call with: its id is the key, the whole order its fingerprint.
// Never a test.
import { makeIdempotent, IdempotencyConfig } from '@aws-lambda-powertools/idempotency';
import { CachePersistenceLayer } from '@aws-lambda-powertools/idempotency/cache';
import { Idempotency } from '@node-idempotency/core';
import { MemoryStorageAdapter } from '@node-idempotency/storage-adapter-memory';
import { idempotent } from '../index.mjs';

/** `fn` behind idemgate's `idempotent()` on `engine`, duplicates in flight waiting up to 60 s. */
export const ours = (engine) => (fn) =>
  idempotent(engine, 'charge', fn, { key: (o) => o.id, args: (o) => o, wait: 60 });

/** `fn` made idempotent with @node-idempotency/core and its in-memory adapter, duplicates in
 * flight waiting for the first (its `wait` strategy, polling). */
export function nodeIdempotency(fn) {
  const gate = new Idempotency(new MemoryStorageAdapter(), { inProgressStrategy: { wait: true, maxWaitMs: 60_000 } });
  return async (order) => {
    const req = { headers: { 'idempotency-key': order.id }, path: '/charge', method: 'POST', body: order };
    const stored = await gate.onRequest(req);
    if (stored) {
      if (stored.error) throw stored.error;
      return stored.body;
    }
    try {
      const body = await fn(order);
      await gate.onResponse(req, { body });
      return body;
    } catch (error) {
      await gate.onResponse(req, { error: String(error) });
      throw error;
    }
  };
}

/** `fn` made idempotent with Powertools for TypeScript's idempotency utility, its cache
 * persistence layer on `redis` (a connected @redis/client), its keys under `prefix`. */
export function powertools(redis, prefix) {
  // Outside Lambda there is no invocation deadline: a context that has ample time left, as a
  // Lambda's would, so Powertools does not warn on every call.
  const config = new IdempotencyConfig({ eventKeyJmesPath: 'id' });
  config.registerLambdaContext({ getRemainingTimeInMillis: () => 900_000 });
  // A layer of its own for each function: a persistence layer is configured once, for the first
  // function it serves.
  return (fn) =>
    makeIdempotent(fn, { persistenceStore: new CachePersistenceLayer({ client: redis, keyPrefix: prefix }), config });
}

/** The floor on Redis: `fn` behind the client's own round trips on `redis`, no library, its keys
 * under `prefix`. A fresh call is `SET NX GET`, then `SET XX` with the result; a duplicate is the
 * one `SET NX GET`, which hands back the stored result. */
export const redisFloor = (redis, prefix) => (fn) => async (order) => {
  const name = `${prefix}:${order.id}`;
  const stored = await redis.set(name, '', { NX: true, GET: true, PX: 3_600_000 });
  if (stored !== null) return JSON.parse(stored);
  const result = await fn(order);
  await redis.set(name, JSON.stringify(result), { XX: true, PX: 3_600_000 });
  return result;
};
