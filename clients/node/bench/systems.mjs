// The floor on Redis that bench/peers.mjs and bench/calls.mjs both time: the client's own round
// trips with no library. A fresh call is `SET NX GET`, then `SET XX` with the result; a duplicate
// is the one `SET NX GET`, which hands back the stored result. Never a test.

/** `fn` behind the floor on `redis` (a connected @redis/client), its keys under `prefix`. */
export const redisFloor = (redis, prefix) => (fn) => async (order) => {
  const name = `${prefix}:${order.id}`;
  const stored = await redis.set(name, '', { NX: true, GET: true, PX: 3_600_000 });
  if (stored !== null) return JSON.parse(stored);
  const result = await fn(order);
  await redis.set(name, JSON.stringify(result), { XX: true, PX: 3_600_000 });
  return result;
};
