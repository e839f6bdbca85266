'use strict';
// The idemgate engine in-process: at-most-once calls of a function, the same engine, store
// formats and rules as the Python package and the `idemgate` command (see README.md).
const { AsyncLocalStorage } = require('node:async_hooks');
const os = require('node:os');
const native = require('./native.cjs');
const { Carried } = require('./carried.cjs');
const { errorOf, Failed, NotApplied, OutcomeNotRecorded, OutcomeUnknown } = require('./errors.cjs');

/** `Engine`'s call as `idempotent` makes it (see `Engine[RUN]`): not part of the API. */
const RUN = Symbol('idemgate.run');
/** The first character of the addon's lean reply that is a replay's stored value ('v'). */
const LEAN_VALUE = 0x76;
/** The first character of its lean reply that lets the call run ('x': `x<id> <digest>
 * [<traceparent>]`). */
const LEAN_EXECUTE = 0x78;

/** The downstream key of the call whose function runs in this async context (see `currentKey`). */
const current = new AsyncLocalStorage();
// The tool of the observed call whose function runs (observe mode): a call of the same tool inside
// it (an adapter's window inside the call id's record) is that call, observed once.
const observedTool = new AsyncLocalStorage();

/** The downstream key of the action whose function is running: the 64-hex digest of its record
 * (SHA-256 of tenant, tool and key), the same on every attempt of the action, in every process
 * and every language, as `idemgate mcp` fills a tool's `idempotency_key` argument. Throws
 * outside a function idemgate runs. */
function currentKey() {
  const key = current.getStore();
  if (key === undefined) throw new Error('currentKey() is only known inside a function idemgate runs');
  return key;
}

/** The answer to a call that ended with a result: `value` (the function's, or the stored one of
 * a replay), `executed` (this call ran the function), `replayed` (the stored outcome of an earlier
 * call), `executedAt`/`expiresAt` (Dates), `rule` (`explicit` or `fallback`), `key`, `verdict`
 * (`executed`, `replayed`, `pass_through`), `content` (`json`, `command`...), `recording`
 * (`stored` or `journaled`), `explanation` (for a person) and `forModel` (for a model). */
class Result {
  constructor(fields) {
    Object.assign(this, fields);
    Object.freeze(this);
  }
}

const time = (ms) => (ms === null || ms === undefined ? null : new Date(ms));

/** The Result of a native answer reply, with `value` (what the function returned) or else the
 * stored value; a stored failure throws `Failed`. */
function resultOf(reply, value, useStored) {
  const stored = () => (reply.value_json === undefined ? null : JSON.parse(reply.value_json));
  if (reply.failed) throw new Failed(stored(), { replayed: reply.replayed });
  return new Result({
    value: useStored ? stored() : value,
    executed: reply.executed,
    replayed: reply.replayed,
    executedAt: time(reply.executed_at_ms),
    expiresAt: time(reply.expires_at_ms),
    rule: reply.rule ?? null,
    key: reply.key ?? null,
    verdict: reply.verdict,
    content: reply.content ?? null,
    recording: reply.recording ?? null,
    explanation: reply.explanation ?? null,
    forModel: reply.for_model ?? null,
  });
}

/** Who an operator's change is by: `by`, else the OS user (as `idemgate keys` records it). */
function who(by) {
  if (by !== undefined && by !== null) return String(by);
  try {
    return os.userInfo().username;
  } catch {
    return null;
  }
}

/** A reply's JSON as a value, or its error thrown. */
function parsed(text) {
  const reply = JSON.parse(text);
  if (reply !== null && typeof reply === 'object' && typeof reply.error === 'string') throw errorOf(reply);
  return reply;
}

/** `JSON.stringify(value)` as the Python package's `json.dumps(value, allow_nan=False)`: NaN and
 * the infinities are not JSON and throw (JSON.stringify would write them as null), as do
 * BigInts and cycles; `undefined` is stored as null. A text without `null` had none of them, so
 * only one with `null` is written again with the replacer that finds them (a replacer costs
 * a call of it per value: as much as the rest of a replay). */
function jsonText(value) {
  const text = JSON.stringify(value);
  if (text === undefined) return 'null';
  if (!text.includes('null')) return text;
  return JSON.stringify(value, (_, v) => {
    if (typeof v === 'number' && !Number.isFinite(v)) throw new TypeError(`${v} is not JSON`);
    return v;
  });
}

/** `e`'s name and message for a person, whatever was thrown (a value whose getters throw, an
 * object without a prototype, a revoked Proxy): never throws. */
function described(e) {
  try {
    const name = e?.constructor?.name ?? typeof e;
    return `${name}: ${e?.message ?? String(e)}`;
  } catch {
    return `a thrown ${typeof e} that cannot be shown`;
  }
}

/** What a function's exception tells the engine (the Python package's `_report`). Never
 * throws: whatever the function threw, its outcome is recorded. */
function report(e) {
  try {
    if (e instanceof NotApplied) return ['not_applied', e.message || 'not applied'];
    if (e instanceof Failed) {
      try {
        return ['failed', jsonText(e.result)];
      } catch {
        return ['failed', JSON.stringify(described(e.result))];
      }
    }
  } catch {
    // A Proxy whose traps throw: what it was is unknown, so the work may have been done.
  }
  // MaybeApplied, and every other exception: the function may have done its work first.
  return ['ambiguous', described(e).slice(0, 500)];
}

/** The policy fields a call or a wrapper overrides, by the engine's names; `window` is
 * `fallbackWindow`; `tombstone` (seconds, default 30 days, 0: none) how long after a call ran
 * a retry past the `ttl` is answered `OutcomeExpired` instead of running again; `identity` the
 * arguments that name the action (the window compares only these); `mode` `enforce` or
 * `observe` (shadow mode: every call runs, what enforce would have done is recorded). */
const POLICY_FIELDS = ['kind', 'ttl', 'lease', 'wait', 'fallbackWindow', 'onUnknown', 'tombstone', 'identity', 'mode'];

function policyOf(options) {
  const p = {};
  for (const f of POLICY_FIELDS) if (options[f] !== undefined && options[f] !== null) p[f] = options[f];
  if (options.window !== undefined && options.window !== null) p.fallbackWindow = options.window;
  return p;
}

// Whether idemgate's spans are exported: the OTEL_* variables point at a collector (read by the
// native engine when the first engine opens). Only then is the caller's active span looked at.
let tracing = false;
// `@opentelemetry/api`, when the program has it (undefined: not looked for yet; null: absent).
let otelApi;

/** The W3C context of the active OpenTelemetry span, when spans are exported and the program
 * uses `@opentelemetry/api`: idemgate's spans for the call are then its children. */
function callerTrace() {
  if (!tracing) return undefined;
  if (otelApi === undefined) {
    try {
      otelApi = require('@opentelemetry/api');
    } catch {
      otelApi = null;
    }
  }
  const context = otelApi?.trace.getActiveSpan()?.spanContext();
  if (!context || !otelApi.isSpanContextValid(context)) return undefined;
  const flags = (context.traceFlags & 0xff).toString(16).padStart(2, '0');
  return {
    traceparent: `00-${context.traceId}-${context.spanId}-${flags}`,
    tracestate: context.traceState?.serialize() || undefined,
  };
}

/** Runs `fn` with `traceparent` (idemgate.effect's context, from `begin`) as the active span of
 * `@opentelemetry/api`, so the spans the function makes (its HTTP client's, its own) are the
 * effect's children. */
function inEffect(traceparent, fn) {
  if (!tracing || !traceparent || !otelApi) return fn();
  const [, traceId, spanId, flags] = traceparent.split('-');
  const effect = otelApi.trace.setSpanContext(otelApi.context.active(), {
    traceId, spanId, traceFlags: parseInt(flags, 16), isRemote: false,
  });
  return otelApi.context.with(effect, fn);
}

/** A policy as the addon's `begin` and `keyFor` take it: JSON text, none for the engine's
 * defaults. A call is given to them field by field (its optional fields absent, never null):
 * reading an object's fields across the boundary costs more than the engine's work. */
const policyJson = (policy) => {
  for (const _ in policy) return jsonText(policy);
  return undefined;
};

/** Rejects with the signal's reason when it aborts first; `work` goes on, its outcome recorded. */
function untilAborted(work, signal) {
  if (!signal) return work;
  work.catch(() => {}); // the caller may stop waiting: its rejection is recorded, not unhandled
  return new Promise((resolve, reject) => {
    const abort = () => reject(signal.reason);
    signal.addEventListener('abort', abort, { once: true });
    work.then(
      (v) => {
        signal.removeEventListener('abort', abort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener('abort', abort);
        reject(e);
      },
    );
  });
}

// An engine dropped without `close()` closes its carried socket when it is collected, so that
// the socket (which holds the native engine through its handlers) does not keep it forever.
const dropped = new FinalizationRegistry((carried) => carried.close());

class Engine {
  #native;
  #tools;
  #default;
  /** The Redis connection Node's loop carries (carried.cjs), when the store has one. */
  #carried;

  constructor(nativeEngine, { tools = {}, default: defaultPolicy = {} } = {}, carried = null) {
    this.#native = nativeEngine;
    this.#tools = new Map(Object.entries(tools));
    this.#default = defaultPolicy;
    this.#carried = carried;
    if (carried !== null) dropped.register(this, carried, this);
  }

  /** The addon's answer as a value or a promise: a number is a call parked on the connection
   * Node's loop carries, whose reply that connection delivers. */
  #later(reply) {
    if (typeof reply !== 'number') return reply;
    return this.#carried.park(reply);
  }

  /** Opens the store at `url`: `memory:`, `sqlite:///path`, `postgres://…`, `redis://…`; none:
   * the SQLite file every `idemgate` command uses. `journal`: the directory of outcomes the
   * store did not confirm (else beside the SQLite file, as the command line keeps it);
   * `tenant` (default `default`); `tools`: policies by tool name; `default`: the others'.
   * Rejects with `StoreMisconfigured` or `StoreUnavailable`. */
  static async open(url, { journal, tenant = 'default', tools, default: defaultPolicy } = {}) {
    let n;
    try {
      n = await native.openEngine(url ?? null, journal ?? null, tenant);
    } catch (e) {
      let reply;
      try {
        reply = JSON.parse(e.message);
      } catch {
        throw e;
      }
      throw errorOf(reply);
    }
    if (!tracing && native.tracing()) {
      tracing = true;
      // A pipeline of the process's own is never dropped: send what is left as Node exits.
      process.once('exit', () => native.flushTraces());
    }
    // A single Redis server: its round trips on a socket of Node's own loop (carried.cjs).
    const target = n.carriedTarget();
    let carried = null;
    if (target) {
      carried = new Carried(n, target);
      await carried.connect(true);
    }
    return new Engine(n, { tools, default: defaultPolicy }, carried);
  }

  get url() {
    return this.#native.url;
  }
  get tenant() {
    return this.#native.tenant;
  }
  get journal() {
    return this.#native.journal ?? null;
  }

  /** The policy of `tool`'s calls: the engine's for it, with `overrides`. */
  policy(tool, overrides = {}) {
    return { ...this.#default, ...(this.#tools.get(tool) ?? {}), ...policyOf(overrides) };
  }

  /** The record a call would be judged by (`tenant`, `tool`, `key`, `rule`, `ttl`, `digest`);
   * null for reads and naturally idempotent tools. Throws `KeyRequired` for a write without key
   * or window. */
  keyFor(tool, key, args, { scope, ...overrides } = {}) {
    const argsJson = args === undefined ? null : jsonText(args);
    const policy = policyJson(this.policy(tool, overrides));
    return parsed(this.#native.keyFor(tool, key ?? undefined, argsJson ?? undefined, policy, scope ?? undefined));
  }

  /** The state of the record of `(tool, key)`: `{state, fence}` or null. */
  async recordState(tool, key) {
    return parsed(await this.#later(this.#native.recordState(tool, key)));
  }

  /** The record of `(tool, key)` (`state`, `fence`, `outcome` with its `content` and `body`...),
   * or null. */
  async record(tool, key) {
    return parsed(await this.#later(this.#native.record(tool, key)));
  }

  /** This tenant's records, oldest first, each as `record` shows it: only those in `state`
   * (`in_flight`, `completed`, `unknown`, `expired`), only `tool`'s, only those made in `scope` (the
   * conversation an adapter named), at most `limit` (0: all). `records({ state: 'unknown' })`
   * lists what an operator must resolve. */
  async records({ state, tool, scope, limit = 0 } = {}) {
    return parsed(await this.#later(this.#native.records(tool ?? null, state ?? null, scope ?? null, limit)));
  }

  /** Resolves an unknown record as an operator decided, if its `fence` (from `record` or
   * `records`) is still the one looked at: `resolution` `'completed'` with the `result` the side
   * effect had (JSON data; `failed: true`: a terminal failure), stored for the tool's TTL and
   * replayed marked as an operator's resolution, or `'release'` (it did not happen: the next call
   * runs). `reason` and `by` (default: the OS user) go into the audit log. Resolves to the record
   * after (null once released); rejects with `NotFound`, `NotResolvable` (not unknown, or its
   * fence moved on) or `StoreUnavailable`. `idemgate keys resolve`, in-process. */
  async resolve(tool, key, fence, resolution, { result, failed = false, reason, by } = {}) {
    const text = resolution === 'release' && result === undefined ? null : jsonText(result);
    const ttl = this.policy(tool).ttl ?? null;
    return parsed(
      await this.#later(this.#native.resolve(tool, key, fence, resolution, text, failed, ttl, who(by), reason ?? null)),
    );
  }

  /** Reopens a completed, expired or unknown record, if its `fence` is still the one looked at,
   * so that the next call with this key runs the action again (the payment was refunded, the mail
   * bounced). `reason` is required; it and `by` (default: the OS user) go into the audit log.
   * Resolves to the state the record had (`'completed'`, `'expired'` or `'unknown'`); rejects with
   * `NotFound`, `NotResolvable` (in flight, where reopening could run it twice, or its fence
   * moved on) or `StoreUnavailable`. Other processes' engines may replay their copy of a
   * completed record for up to 2 s more. `idemgate keys reopen`, in-process. */
  async reopen(tool, key, fence, { reason, by } = {}) {
    if (typeof reason !== 'string' || reason === '') {
      throw new TypeError('reopen(tool, key, fence, { reason }): say why the action must run again');
    }
    return parsed(await this.#later(this.#native.reopen(tool, key, fence, who(by), reason))).was;
  }

  /** Runs `fn()` at most once for `(tool, key)` and says what happened (a `Result`).
   *
   * `args` (JSON data) are fingerprinted: the same key with other arguments throws `KeyReused`.
   * A replay returns the stored value without calling `fn`; a racing call waits up to the
   * policy's `wait`, then throws `InFlight`; an unknown outcome throws `OutcomeUnknown`; a call
   * after the policy's `ttl` and within its `tombstone` (default 30 days after the call ran)
   * throws `OutcomeExpired`, running nothing. `scope`
   * names where the call was made (a conversation): a call without key is joined by the
   * fallback window only to identical calls of the same scope. `signal` (an AbortSignal): when
   * it aborts, the caller stops waiting (the promise rejects with its reason) but a function
   * already running finishes and its outcome is recorded; aborted before the function starts,
   * the key is released and the function never runs. */
  call(tool, key, args, fn, { scope, signal, callId, ...overrides } = {}) {
    if (signal?.aborted) return Promise.reject(signal.reason);
    let policy;
    try {
      policy = policyJson(this.policy(tool, overrides));
    } catch (e) {
      return Promise.reject(e);
    }
    const work = this.#run(tool, key, args, fn, scope, policy, signal, callId, false);
    return untilAborted(work, signal);
  }

  /** `call` as `idempotent`'s wrapper makes it: the tool's policy already as JSON text (see
   * `policyJson`), and with `lean` the promise of the value alone instead of a `Result`, which
   * spares the addon the answer's explanation and the package the `Result`. */
  [RUN](tool, key, args, fn, scope, policy, signal, callId, lean) {
    if (signal?.aborted) return Promise.reject(signal.reason);
    return untilAborted(this.#run(tool, key, args, fn, scope, policy, signal, callId, lean), signal);
  }

  // Observe mode: the function runs, nothing is recorded. A call of this tool inside the
  // function (the window inside a call id's record) is this same call, observed once.
  async #passThrough(tool, fn, begun, lean) {
    const value = begun.observed === undefined
      ? await fn()
      : await observedTool.run(tool, () => (begun.digest ? current.run(begun.digest, fn) : fn()));
    if (lean) return value;
    // `observed`: observe mode ran a call enforce mode would have answered so (`replayed`...).
    return new Result({
      value, executed: true, replayed: false, executedAt: null, expiresAt: null, rule: null,
      key: null, verdict: 'pass_through', content: null, recording: null, explanation: null, forModel: null,
      ...(begun.observed === undefined ? {} : { observed: begun.observed }),
    });
  }

  async #run(tool, key, args, fn, scope, policy, signal, callId, lean) {
    const n = this.#native;
    const argsJson = args === undefined ? undefined : jsonText(args);
    const trace = callerTrace();
    if (this.#carried !== null && !this.#carried.up) this.#carried.connect(); // back once it is
    let begin = n.begin(tool, key ?? undefined, argsJson, policy, scope ?? undefined, callId ?? undefined,
      trace?.traceparent, trace?.tracestate, observedTool.getStore() === tool, lean);
    // An answer the addon had at once is not awaited: that would cost a turn of the microtasks.
    if (typeof begin !== 'string') begin = await this.#later(begin);
    let ticket;
    let digest;
    let traceparent;
    const first = begin.charCodeAt(0);
    if (lean && first === LEAN_VALUE) return JSON.parse(begin.slice(1)); // a replay
    if (lean && first === LEAN_EXECUTE) {
      const id = begin.indexOf(' ');
      const tail = begin.indexOf(' ', id + 1);
      ticket = Number(begin.slice(1, id));
      digest = tail < 0 ? begin.slice(id + 1) : begin.slice(id + 1, tail);
      traceparent = tail < 0 ? undefined : begin.slice(tail + 1);
    } else {
      const begun = parsed(begin);
      if (begun.pass_through) return this.#passThrough(tool, fn, begun, lean);
      if (begun.execute === undefined) {
        const replayed = resultOf(begun, undefined, true);
        return lean ? replayed.value : replayed;
      }
      ({ execute: ticket, digest, traceparent } = begun);
    }
    if (signal?.aborted) {
      // The caller went away before the function ran: free the key at once.
      await this.#later(n.finish(ticket, 'not_applied', 'the caller was cancelled before it ran'));
      throw signal.reason;
    }
    let value;
    try {
      value = await current.run(digest, () => inEffect(traceparent, fn));
    } catch (e) {
      const [kind, body] = report(e);
      try {
        parsed(await this.#later(n.finish(ticket, kind, body)));
      } catch (recorded) {
        if (!(recorded instanceof NotApplied || recorded instanceof OutcomeUnknown || recorded instanceof Failed)
            && e !== null && typeof e === 'object' && Object.isExtensible(e)) {
          e.idemgateRecordingError = recorded; // the function's own exception wins
        }
      }
      throw e;
    }
    let text;
    try {
      text = jsonText(value);
    } catch (e) {
      const why = described(e);
      try {
        await this.#later(n.finish(ticket, 'ambiguous', `the return value is not JSON: ${why}`.slice(0, 500)));
      } catch {
        // The TypeError below says the record is unknown; the store's own failure adds nothing.
      }
      throw new TypeError(
        `${tool}: the function ran, but its return value cannot be stored as JSON, so the record ` +
          `is now unknown (resolve it with \`idemgate keys resolve\`): ${why}`,
      );
    }
    let reply;
    try {
      let finished = n.finish(ticket, 'success', text, lean);
      if (typeof finished !== 'string') finished = await this.#later(finished);
      if (lean && finished === '') return value; // recorded; the caller wants only the value
      reply = parsed(finished);
    } catch (e) {
      if (e instanceof OutcomeNotRecorded) e.result = value;
      throw e;
    }
    return lean ? value : resultOf(reply, value, false);
  }

  /** Stops the engine's journal flusher; later calls reject. Calls running now are recorded. */
  close() {
    this.#native.close();
    if (this.#carried !== null) {
      this.#carried.close();
      dropped.unregister(this);
    }
  }

  toString() {
    return `Engine(${this.url}, tenant=${this.tenant})`;
  }
}

/** The arguments of a wrapped call that are fingerprinted when `args` is not given: the Python
 * decorator's `{"args": [...], "kwargs": {}}`, so the same call from Python and from Node is
 * the same action. */
const defaultArgs = (a) => ({ args: a, kwargs: {} });

/** `fn` run at most once per idempotency key, in-process. `tool` names it; `options.key(...args)`
 * names the logical action of a call (a tool-call id, `deriveKey(runId, step)`; null or
 * undefined: the tool's fallback window, if it has one, else `KeyRequired`); `options.args(...a)`
 * the JSON arguments that are fingerprinted (default: all of them, as the Python decorator);
 * `options.scope` a string or a function of the arguments (where the call was made);
 * `options.signal(...a)` the AbortSignal of a call; the policy fields (`kind`, `ttl`, `lease`,
 * `wait`, `window`/`fallbackWindow`, `onUnknown`, `tombstone`, `identity`, `mode`) override the
 * engine's for the tool, read once, when the wrapper is made. The wrapper returns a promise of
 * the value (a replay: the stored one); `wrapper.result(...a)` makes the same call and resolves
 * to the whole `Result`, to tell a replay from a run. */
function idempotent(engine, tool, fn, options = {}) {
  if (typeof tool !== 'string') throw new TypeError('idempotent(engine, tool, fn, options): tool must be a string');
  if (typeof fn !== 'function') throw new TypeError('idempotent(engine, tool, fn, options): fn must be a function');
  const { key, args, scope, signal, callId, ...policy } = options;
  // Once: an engine's policies do not change, and the addon reads the same text once.
  const policyText = policyJson(engine.policy(tool, policy));
  const run = (a, lean) => {
    try {
      const k = typeof key === 'function' ? key(...a) : key;
      const payload = args ? args(...a) : defaultArgs(a);
      const s = typeof scope === 'function' ? scope(...a) : scope;
      const sig = typeof signal === 'function' ? signal(...a) : signal;
      return engine[RUN](tool, k, payload, () => fn(...a), s, policyText, sig, callId, lean);
    } catch (e) {
      return Promise.reject(e);
    }
  };
  const wrapper = (...a) => run(a, true);
  Object.defineProperty(wrapper, 'name', { value: fn.name || tool });
  wrapper.result = (...a) => run(a, false);
  return wrapper;
}

/** `fn()` seeing `key` as its `currentKey` (an adapter runs a function under the record of the
 * call's key while a window record is the innermost). */
const withCurrentKey = (key, fn) => current.run(key, fn);

module.exports = { Engine, Result, idempotent, currentKey, withCurrentKey, jsonText, POLICY_FIELDS };
