// What the tests share: fresh stores, unique tenants, and waits bounded by generous deadlines.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';

export const POSTGRES_URL = process.env.IDEMGATE_TEST_POSTGRES_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
export const REDIS_URL = process.env.IDEMGATE_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';

/** A name no other run uses (the shared PostgreSQL and Redis are never flushed). */
export const unique = (what) => `${what}-${process.pid}-${randomBytes(6).toString('hex')}`;

/** A fresh directory for a SQLite file and its journal. */
export const scratch = () => mkdtempSync(path.join(tmpdir(), 'idemgate-node-'));

/** A SQLite store URL in a fresh directory, with its journal directory. */
export function sqliteStore() {
  const dir = scratch();
  return { url: `sqlite://${path.join(dir, 'idemgate.db')}`, journal: path.join(dir, 'journal'), dir };
}

/** A promise and the functions that settle it. */
export function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** `promise`, or a rejection naming `what` after `ms` (a generous deadline, never the test's
 * expected timing). */
export function within(promise, what, ms = 60_000) {
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

/** Resolves once no record of `engine`'s tenant is in flight: every call begun has ended and
 * its outcome is recorded (the next call of a test then never races it). Looks again at each
 * turn of the event loop, within a generous deadline. */
export function settled(engine) {
  const look = async () => {
    while ((await engine.records({ state: 'in_flight' })).length > 0) {
      await new Promise((resolve) => setImmediate(resolve));
    }
  };
  return within(look(), 'the calls in flight to end');
}
