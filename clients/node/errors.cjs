'use strict';
// The errors of the idemgate package, named as the Python package's (`idemgate.errors`), so a
// caller can `instanceof` them. Errors of an answer carry the HTTP gateway's problem document
// (`problem`: type, title, status, detail, verdict and the answer's facts) and its `status`.

class IdemgateError extends Error {
  constructor(message, { status = null, problem = {} } = {}) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.problem = problem;
  }
  /** The verdict label of the answer (`in_flight`, `unknown`...). */
  get verdict() {
    return this.problem.verdict ?? null;
  }
  /** What a model reads about this answer (the kit's explanation for a model). */
  get forModel() {
    return this.problem.for_model ?? null;
  }
}

/** The call was refused as malformed (a bad key, arguments that are not JSON...). */
class BadRequest extends IdemgateError {}
/** A write was called without an idempotency key and its tool has no fallback window. */
class KeyRequired extends BadRequest {}
class NotFound extends IdemgateError {}
/** The key was used before with other arguments. */
class KeyReused extends IdemgateError {}
/** The record's state refuses the call now. */
class Conflict extends IdemgateError {}
/** Another call holds the key and did not finish within the wait bound. */
class InFlight extends Conflict {
  get retryAfter() {
    return this.problem.retry_after ?? null;
  }
}
/** The outcome of the action is unknown (a call stopped mid-way, or its function threw): it is
 * never run again until an operator resolves the record (`idemgate keys resolve`). */
class OutcomeUnknown extends Conflict {
  get since() {
    return this.problem.since ?? null;
  }
  get fence() {
    return this.problem.fence ?? null;
  }
}
/** The action ran before under this key (at `executedAt`) and its result is no longer kept:
 * the record's TTL passed (at `expiredAt`), and its tombstone (the tool's `tombstone`, default
 * 30 days after the call ran) remembers the action until `retainUntil`, so that a late retry is
 * not run again. Nothing ran now, and the stored result cannot be shown. To do it again on
 * purpose, call with a new key (a new action), or reopen the record at `fence`
 * (`engine.reopen(tool, key, fence, { reason })`, `idemgate keys reopen`). HTTP 410 (Gone), so
 * not a `Conflict`. The times are RFC 3339 strings, as the problem document has them. */
class OutcomeExpired extends IdemgateError {
  /** The record's key. */
  get key() {
    return this.problem.key ?? null;
  }
  /** The rule that named the record (`explicit` or `fallback`). */
  get rule() {
    return this.problem.rule ?? null;
  }
  /** When the action ran (its outcome was recorded). */
  get executedAt() {
    return this.problem.executed_at ?? null;
  }
  /** When its outcome stopped being replayed (the record's TTL). */
  get expiredAt() {
    return this.problem.expired_at ?? null;
  }
  /** Until when the record answers "expired" (then the key names a new action). */
  get retainUntil() {
    return this.problem.retain_until ?? null;
  }
  /** The record's fence, which `engine.reopen` names. */
  get fence() {
    return this.problem.fence ?? null;
  }
}
class LeaseLost extends Conflict {}
class NotResolvable extends Conflict {}
class RateLimited extends IdemgateError {}
class QuotaExceeded extends IdemgateError {}
/** The store could not be reached; nothing ran, retrying is safe. */
class StoreUnavailable extends IdemgateError {}
/** The function ran but its outcome was recorded neither in the store nor in the journal. */
class OutcomeNotRecorded extends IdemgateError {
  constructor(message, options = {}) {
    super(message, options);
    this.result = options.result;
  }
}

/** The store URL or the store is set up wrong (a misspelt scheme, an unknown option...):
 * retrying cannot help. */
class StoreMisconfigured extends Error {
  constructor(message) {
    super(message);
    this.name = 'StoreMisconfigured';
  }
}

/** Thrown by a function: nothing happened, so the key is released and a retry runs. Thrown by
 * the engine when the function said so. */
class NotApplied extends Error {
  constructor(message = 'not applied', { status = null, problem = {} } = {}) {
    super(message);
    this.name = 'NotApplied';
    this.status = status;
    this.problem = problem;
  }
}

/** Thrown by a function: a terminal failure, whose `result` is stored and replayed to duplicates
 * (a replay throws `Failed` again, with `replayed` true). */
class Failed extends Error {
  constructor(result = null, { replayed = false } = {}) {
    super(typeof result === 'string' ? result : `failed: ${JSON.stringify(result)}`);
    this.name = 'Failed';
    this.result = result;
    this.replayed = replayed;
  }
}

/** Thrown by a function that may have done its work: the record becomes unknown (any other
 * exception does the same). */
class MaybeApplied extends Error {
  constructor(message) {
    super(message);
    this.name = 'MaybeApplied';
  }
}

/** The class of each verdict label that is an error (the native addon's `verdictLabels` lists
 * them all; a test checks this table against it). */
const CLASSES = {
  not_applied: NotApplied,
  lease_lost: LeaseLost,
  unrecorded: OutcomeNotRecorded,
  journal_failed: OutcomeNotRecorded,
  in_flight: InFlight,
  unknown: OutcomeUnknown,
  expired: OutcomeExpired,
  key_required: KeyRequired,
  key_reused: KeyReused,
  bad_request: BadRequest,
  store_unavailable: StoreUnavailable,
  quota_exceeded: QuotaExceeded,
  rate_limited: RateLimited,
  not_found: NotFound,
  not_resolvable: NotResolvable,
};

/** The error of a native reply `{error, message, status, problem}`. */
function errorOf(reply) {
  if (reply.error === 'misconfigured') return new StoreMisconfigured(reply.message);
  if (reply.error === 'not_json') return new TypeError(reply.message);
  const Class = CLASSES[reply.error];
  if (Class === undefined) return new IdemgateError(`${reply.error}: ${reply.message}`);
  return new Class(reply.message, { status: reply.status ?? null, problem: reply.problem ?? {} });
}

module.exports = {
  IdemgateError,
  BadRequest,
  KeyRequired,
  NotFound,
  KeyReused,
  Conflict,
  InFlight,
  OutcomeUnknown,
  OutcomeExpired,
  LeaseLost,
  NotResolvable,
  RateLimited,
  QuotaExceeded,
  StoreUnavailable,
  StoreMisconfigured,
  OutcomeNotRecorded,
  NotApplied,
  Failed,
  MaybeApplied,
  CLASSES,
  errorOf,
};
