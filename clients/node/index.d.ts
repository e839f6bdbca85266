// Types of the `idemgate` package (the same for its ESM and CommonJS entry points).

/** The fields of a tool's policy a call, `idempotent` or an adapter overrides; left out: the
 * engine's value for the tool. Durations in seconds. */
export interface PolicyOptions {
  /** `write` (gated, the default), `read` or `natural_idempotent` (run without a record). */
  kind?: 'write' | 'read' | 'natural_idempotent';
  /** How long a completed record is kept and replayed (default 24 h). */
  ttl?: number;
  /** How long after a call ran its record is remembered (default 30 days; 0: none): a retry
   * past the `ttl` and within it is not run again but refused with `OutcomeExpired`. */
  tombstone?: number;
  /** How long a running call holds its key before it is taken for dead (default 30 s). */
  lease?: number;
  /** How long a duplicate waits for the running call's outcome before `InFlight` (default 5 s). */
  wait?: number;
  /** An identical call without key (same tool, arguments and scope) within it is the same action. */
  fallbackWindow?: number;
  /** Same as `fallbackWindow`. */
  window?: number;
  /** What a call finding the record unknown does: `block` (the default), `retry` or `verify`. */
  onUnknown?: 'block' | 'retry' | 'verify';
  /** The arguments that name the tool's action (names, or JSON pointers such as `/order/id`):
   * the window compares only these, so a call that rewords the rest (a re-planned mail's body)
   * within it is the same action, and the model is told an action with the same ones ran. A
   * call lacking one is named by all its arguments; a key is never affected. */
  identity?: readonly string[];
  /** `enforce` (the default) or `observe`: shadow mode, for adopting idemgate on a live agent.
   * Every call runs (nothing is replayed, waited for or refused), and what enforce mode would
   * have done is recorded in the history of the record a call duplicates; such a call's
   * `Result` says it in `observed`. */
  mode?: 'enforce' | 'observe';
}

export interface OpenOptions {
  /** The directory of outcomes the store did not confirm (default: beside the SQLite file). */
  journal?: string;
  /** Whose records these are (default `default`). */
  tenant?: string;
  /** Policies by tool name. */
  tools?: Record<string, PolicyOptions>;
  /** The policy of the other tools. */
  default?: PolicyOptions;
}

export interface CallOptions extends PolicyOptions {
  /** Where the call was made (a conversation): the fallback window joins only calls of one scope. */
  scope?: string | null;
  /** When it aborts the caller stops waiting; a function already running finishes and is recorded. */
  signal?: AbortSignal | null;
  /** The model's tool call id, for the call's span (`gen_ai.tool.call.id`) when traces are exported. */
  callId?: string | null;
}

/** The answer to a call that ended with a result. */
export declare class Result<T = unknown> {
  readonly value: T;
  /** This call ran the function. */
  readonly executed: boolean;
  /** The stored outcome of an earlier call, replayed without running the function. */
  readonly replayed: boolean;
  readonly executedAt: Date | null;
  readonly expiresAt: Date | null;
  /** `explicit` (the caller's key) or `fallback` (the tool's fallback window). */
  readonly rule: 'explicit' | 'fallback' | null;
  readonly key: string | null;
  /** `executed`, `replayed` or `pass_through`. */
  readonly verdict: string;
  /** The stored outcome's kind: `json` (Node, Python), `command` (`idemgate exec`)... */
  readonly content: string | null;
  /** `stored` or `journaled` when this call recorded an outcome. */
  readonly recording: string | null;
  /** What happened, for a person. */
  readonly explanation: string | null;
  /** What happened, for a model. */
  readonly forModel: string | null;
  /** Observe mode (shadow mode) only: this call ran, and enforce mode would have answered it
   * without running, with this verdict (`replayed`, `in_flight`, `unknown`, `expired`,
   * `key_reused`, `key_required`, `store_unavailable`). */
  readonly observed?: string;
}

export interface RecordName {
  tenant: string;
  tool: string;
  key: string;
  rule: 'explicit' | 'fallback';
  ttl: number;
  digest: string;
}

/** A record as an operator sees it (`idemgate keys show --json`'s shape). */
/** A record's state: `expired` is a completed record past its ttl, within its tombstone. */
export type RecordStateName = 'in_flight' | 'completed' | 'unknown' | 'expired';

export interface StoredRecord {
  key: { tenant: string; tool: string; key: string };
  state: RecordStateName;
  fence: number;
  fingerprint?: string;
  scope?: string;
  created_at: string;
  completed_at?: string;
  expires_at?: string;
  /** A completed record's outcome: its kind, and its content as JSON. */
  outcome?: { kind: 'success' | 'failed'; content: string; body: unknown };
  /** The key a downstream sees for this record (hex SHA-256): what to search for there. */
  downstream_key: string;
  /** Why an unknown record is unknown: the reason its call gave, or that none is on record. */
  reason?: string;
  /** Its story, oldest first, from its state and the history the store keeps with it. */
  history: RecordStep[];
  [field: string]: unknown;
}

/** One step of a record's story. */
export interface RecordStep {
  at: string;
  fence?: number;
  /** `reserved`, `completed`, `expired`, `unknown`, `became_unknown`, `late_outcome_refused`,
   * `retried_after_unknown`, `verified`, `resolved_completed`, `resolved_released`, `reopened`. */
  what: string;
  /** Who acted, when a person did. */
  by?: string;
  reason?: string;
  /** The step in one sentence. */
  text: string;
}

export interface RecordsFilter {
  state?: RecordStateName;
  tool?: string;
  scope?: string;
  /** At most this many (0: all). */
  limit?: number;
}

export declare class Engine {
  /** Opens the store at `url`: `memory:`, `sqlite:///path`, `postgres://…`, `redis://…`; none: the
   * SQLite file every `idemgate` command uses. Rejects with `StoreMisconfigured` or
   * `StoreUnavailable`. */
  static open(url?: string | null, options?: OpenOptions): Promise<Engine>;
  readonly url: string;
  readonly tenant: string;
  readonly journal: string | null;
  /** The policy of `tool`'s calls, with `overrides`. */
  policy(tool: string, overrides?: PolicyOptions): PolicyOptions;
  /** The record a call would be judged by; null for reads. */
  keyFor(tool: string, key: string | null | undefined, args: unknown, options?: CallOptions): RecordName | null;
  /** The state of the record of `(tool, key)`, or null when there is none. */
  recordState(tool: string, key: string): Promise<{ state: RecordStateName; fence: number } | null>;
  /** The record of `(tool, key)` as `idemgate keys show --json` shows it, or null. */
  record(tool: string, key: string): Promise<StoredRecord | null>;
  /** This tenant's records, oldest first; `records({ state: 'unknown' })` lists what an operator
   * must resolve. */
  records(filter?: RecordsFilter): Promise<StoredRecord[]>;
  /** Resolves an unknown record at `fence` as an operator decided: `completed` with the `result`
   * the side effect had, or `release` (it did not happen). The record after, null once released;
   * rejects with `NotFound` or `NotResolvable`. */
  resolve(
    tool: string,
    key: string,
    fence: number,
    resolution: 'completed' | 'release',
    options?: { result?: unknown; failed?: boolean; reason?: string; by?: string },
  ): Promise<StoredRecord | null>;
  /** Reopens a completed, expired or unknown record at `fence` so that the next call runs the
   * action again; the state it had. Rejects with `NotFound` or `NotResolvable`. */
  reopen(
    tool: string,
    key: string,
    fence: number,
    options: { reason: string; by?: string },
  ): Promise<'completed' | 'expired' | 'unknown'>;
  /** Runs `fn()` at most once for `(tool, key)`; `args` (JSON data) are fingerprinted. */
  call<T>(
    tool: string,
    key: string | null | undefined,
    args: unknown,
    fn: () => T | Promise<T>,
    options?: CallOptions,
  ): Promise<Result<T>>;
  /** Stops the journal flusher; later calls reject. */
  close(): void;
}

export interface IdempotentOptions<A extends unknown[]> extends PolicyOptions {
  /** The idempotency key of a call (null or undefined: the fallback window, else `KeyRequired`). */
  key?: ((...args: A) => string | null | undefined) | string;
  /** The JSON arguments fingerprinted (default `{args: [...], kwargs: {}}`, as the Python decorator). */
  args?: (...args: A) => unknown;
  /** Where a call was made (a conversation). */
  scope?: ((...args: A) => string | null | undefined) | string;
  /** The AbortSignal of a call. */
  signal?: ((...args: A) => AbortSignal | null | undefined) | AbortSignal;
}

export interface Idempotent<A extends unknown[], T> {
  (...args: A): Promise<T>;
  /** The same call, resolving to the whole `Result` (a replay or a run). */
  result(...args: A): Promise<Result<T>>;
}

/** `fn` run at most once per idempotency key. */
export declare function idempotent<A extends unknown[], T>(
  engine: Engine,
  tool: string,
  fn: (...args: A) => T | Promise<T>,
  options?: IdempotentOptions<A>,
): Idempotent<A, Awaited<T>>;

/** The downstream key (64-hex record digest) of the action whose function is running. */
export declare function currentKey(): string;
/** A stable key for one step of one run (the Python package's `derive_key`). */
export declare function deriveKey(runId: string, step: string): string;
/** A fresh random key. */
export declare function mintKey(): string;
/** A caller's key as the engine takes it; throws with the reason. */
export declare function checkKey(key: string): string;
/** The fingerprint of a call's arguments given as JSON text. */
export declare function fingerprint(argsJson: string): string;

export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  verdict?: string;
  /** What a model reads about this answer or refusal (`forModel`). */
  for_model?: string;
  [member: string]: unknown;
}

export declare class IdemgateError extends Error {
  readonly status: number | null;
  readonly problem: Problem;
  readonly verdict: string | null;
  readonly forModel: string | null;
}
export declare class BadRequest extends IdemgateError {}
export declare class KeyRequired extends BadRequest {}
export declare class NotFound extends IdemgateError {}
export declare class KeyReused extends IdemgateError {}
export declare class Conflict extends IdemgateError {}
export declare class InFlight extends Conflict {
  readonly retryAfter: number | null;
}
export declare class OutcomeUnknown extends Conflict {
  readonly since: string | null;
  readonly fence: number | null;
}
/** The action ran before under this key and its result is no longer kept (past the ttl, within
 * the tombstone): nothing ran now. A new key runs it again; so does `engine.reopen` at `fence`.
 * HTTP 410. The times are RFC 3339 strings. */
export declare class OutcomeExpired extends IdemgateError {
  readonly key: string | null;
  readonly rule: string | null;
  readonly executedAt: string | null;
  readonly expiredAt: string | null;
  readonly retainUntil: string | null;
  readonly fence: number | null;
}
export declare class LeaseLost extends Conflict {}
export declare class NotResolvable extends Conflict {}
export declare class RateLimited extends IdemgateError {}
export declare class QuotaExceeded extends IdemgateError {}
export declare class StoreUnavailable extends IdemgateError {}
export declare class OutcomeNotRecorded extends IdemgateError {
  result: unknown;
}
export declare class StoreMisconfigured extends Error {}
export declare class NotApplied extends Error {
  constructor(message?: string);
}
export declare class Failed extends Error {
  constructor(result?: unknown, options?: { replayed?: boolean });
  readonly result: unknown;
  readonly replayed: boolean;
}
export declare class MaybeApplied extends Error {
  constructor(message?: string);
}
