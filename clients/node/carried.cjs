'use strict';
// The Redis connection Node's own loop carries for an engine (the addon's carried.rs, over
// crates/idemgate-redis/src/carried.rs): a `net.Socket` of this package's, whose bytes the
// engine queues and reads. A call waiting for a reply is parked in the addon under a number;
// when the reply is read, the call is polled again right here, on Node's thread. A round trip
// thus costs Node's own write, wake-up and read, as a JavaScript Redis client's, instead of
// two hand-offs to the addon's runtime thread and back (each waits for a core on a busy
// machine). While the socket is not connected, calls take the shared connection on the runtime:
// nothing waits for it.
const net = require('node:net');
const { performance } = require('node:perf_hooks');

/** The least time between two attempts to connect after a failure, in ms. */
const RECONNECT_AFTER_MS = 1000;

class Carried {
  #n;
  #target;
  #socket = null;
  #connecting = null;
  #closed = false;
  #lastAttempt = -Infinity;
  /** The parked calls' promises, by their number. */
  #waiting = new Map();
  #flushQueued = false;
  /** When the socket last made progress: a read, or the first command after none waited. */
  #lastProgress = 0;
  #timer = null;

  constructor(native, target) {
    this.#n = native;
    this.#target = target;
    // A parked call woken by anything but a reply (a timer, a racing call's end) is resumed too.
    native.carriedOnWake(() => this.#woken());
  }

  /** Connects the socket (at once, or `RECONNECT_AFTER_MS` after the last failure); resolves
   * once it is up or failed: either way calls go on, on the shared connection meanwhile.
   * `awaited`: the caller waits for it (`Engine.open`), so it keeps the process alive; a
   * reconnection in the background does not. */
  connect(awaited = false) {
    if (this.#closed || this.#socket !== null) return Promise.resolve();
    if (this.#connecting) return this.#connecting;
    const now = performance.now();
    if (now - this.#lastAttempt < RECONNECT_AFTER_MS) return Promise.resolve();
    this.#lastAttempt = now;
    const t = this.#target;
    this.#connecting = new Promise((resolve) => {
      const socket = t.path ? net.connect({ path: t.path }) : net.connect({ host: t.host, port: t.port });
      socket.setNoDelay(true);
      socket.setKeepAlive(true, 30_000); // a half-dead idle connection is found before a call
      let why = 'the connection closed';
      const timer = t.connectTimeoutMs
        ? setTimeout(() => socket.destroy(new Error(`no connection within ${t.connectTimeoutMs} ms`)), t.connectTimeoutMs)
        : null;
      if (!awaited) {
        socket.unref();
        timer?.unref();
      }
      socket.once('connect', () => {
        clearTimeout(timer);
        this.#connecting = null;
        if (this.#closed) {
          socket.destroy();
          resolve();
          return;
        }
        socket.unref(); // an idle engine keeps no process alive; a waiting call refs it
        this.#socket = socket;
        this.#n.carriedConnected();
        this.#flush();
        resolve();
      });
      socket.on('data', (chunk) => this.#read(socket, chunk));
      socket.on('error', (e) => {
        why = e.message;
      });
      socket.once('close', () => {
        clearTimeout(timer);
        if (this.#connecting) {
          this.#connecting = null;
          resolve();
        }
        this.#lost(socket, why);
      });
    });
    return this.#connecting;
  }

  /** Whether the socket is connected (else calls take the shared connection). */
  get up() {
    return this.#socket !== null;
  }

  /** A promise of the reply of the call parked under `id`. */
  park(id) {
    const promise = new Promise((resolve, reject) => {
      this.#waiting.set(id, { resolve, reject });
    });
    if (this.#waiting.size === 1) this.#busy();
    this.#queueFlush();
    return promise;
  }

  /** After the calls running now, no new ones: the socket closes once none waits (a call whose
   * function still runs records its outcome over the shared connection). */
  close() {
    this.#closed = true;
    if (this.#waiting.size === 0) this.#done();
  }

  // Closed and nothing waits: the socket goes, and the wake-up function the addon holds (it
  // holds this link, which holds the native engine) is released, so the engine can be collected.
  #done() {
    if (this.#timer !== null) {
      clearTimeout(this.#timer);
      this.#timer = null;
    }
    if (this.#socket !== null) this.#giveUp(this.#socket, 'the engine was closed');
    this.#n.carriedStopWaking();
  }

  // Writes what the engine queued, once for all the calls of this turn of the loop.
  #queueFlush() {
    if (this.#flushQueued) return;
    this.#flushQueued = true;
    queueMicrotask(() => {
      this.#flushQueued = false;
      this.#flush();
    });
  }

  #flush() {
    const bytes = this.#n.carriedOutput();
    const socket = this.#socket;
    // A socket given up is out of use at once (`#giveUp`), so nothing is queued for it; checked
    // all the same, since a write after `end()` throws.
    if (bytes && socket !== null && !socket.destroyed && !socket.writableEnded) socket.write(bytes);
  }

  // A call now waits: the socket keeps the process alive, and a reply must come in time.
  #busy() {
    this.#lastProgress = performance.now();
    this.#socket?.ref();
    const limit = this.#target.responseTimeoutMs;
    if (limit && this.#timer === null) this.#arm(limit);
  }

  // The response timer stays armed (unref'd) when the last call's reply comes: at its deadline it
  // finds no call waiting and stops. Calls one after another so arm one timer per response
  // timeout instead of one per round trip.
  #idle() {
    this.#socket?.unref();
    if (this.#closed) this.#done();
  }

  // Gives the socket up once a call has waited the response timeout with no reply read.
  #arm(delay) {
    this.#timer = setTimeout(() => {
      this.#timer = null;
      if (this.#waiting.size === 0) return;
      const limit = this.#target.responseTimeoutMs;
      const waited = performance.now() - this.#lastProgress;
      if (waited < limit) {
        this.#arm(limit - waited);
        return;
      }
      const why = `no reply from redis within ${limit} ms`;
      if (this.#socket !== null) this.#giveUp(this.#socket, why, new Error(why));
    }, delay);
    this.#timer.unref();
  }

  #read(socket, chunk) {
    if (socket !== this.#socket) return;
    this.#lastProgress = performance.now();
    const { woken, broken } = this.#n.carriedInput(chunk);
    if (broken) this.#giveUp(socket, broken, new Error(broken));
    this.#resumeAll(woken);
  }

  // The calls woken by anything but a reply (see the constructor).
  #woken() {
    this.#resumeAll(this.#n.carriedWoken());
  }

  // Takes the socket out of use at once (the engine stops queueing on it, and what waits on it
  // fails), then closes it: its 'close' event comes later.
  #giveUp(socket, why, error) {
    this.#lost(socket, why);
    if (error) socket.destroy(error);
    else socket.end();
  }

  #lost(socket, why) {
    if (socket !== this.#socket) return;
    this.#socket = null;
    this.#resumeAll(this.#n.carriedBroken(why));
  }

  // Resumes the woken calls `ids`, writes what they queued, and idles once none waits.
  #resumeAll(ids) {
    for (const id of ids) this.#resume(id);
    this.#flush();
    if (this.#waiting.size === 0) this.#idle();
  }

  // Polls the parked call `id` again: its reply (or the promise of the runtime's) settles its
  // promise, unless it waits here again.
  #resume(id) {
    const waiting = this.#waiting.get(id);
    if (waiting === undefined) return;
    this.#waiting.delete(id);
    let reply;
    try {
      reply = this.#n.resume(id);
    } catch (e) {
      waiting.reject(e);
      return;
    }
    if (typeof reply === 'number') this.#waiting.set(reply, waiting);
    else waiting.resolve(reply);
  }
}

module.exports = { Carried };
