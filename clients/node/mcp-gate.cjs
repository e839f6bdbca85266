'use strict';
// The MCP TypeScript SDK adapter's body (`idemgate/mcp`): `McpServer.registerTool` gated, as the
// Python package's FastMCP middleware and `idemgate mcp` gate a server's write tools. Built with
// the caller's zod (the ESM entry gives the ESM one, the CommonJS entry the CommonJS one), so the
// schema it extends and the SDK read one zod's registry of descriptions.
const { randomUUID } = require('node:crypto');
const { Failed, IdemgateError, MaybeApplied, NotApplied } = require('./errors.cjs');
const {
  KEY_ARGUMENT, callOnce, freshScope, jsonable, nameAction, policyFields, refusalText, splitModelKey, zodKeyArgument,
} = require('./tool-calls.cjs');

/** Where MCP requests carry the idempotency key (`params._meta`), as `idemgate mcp` reads it. */
const KEY_META = 'dev.idemgate/idempotency-key';
/** Where a client sends the framework's tool-call id (`params._meta`), as `idemgate mcp` reads
 * it: the action within the conversation, with the re-emission window. */
const CALL_ID_META = 'dev.idemgate/tool-call-id';
/** Where MCP requests name their conversation (`params._meta`): the re-emission window's scope. */
const CONVERSATION_META = 'dev.idemgate/conversation';

const errorResult = (text) => ({ content: [{ type: 'text', text }], isError: true });

/** idemgate's answer that the call was not run now (or ran and was not recorded), as `idemgate
 * mcp` answers it: an error result whose text is the kit's words for a model (`idemgate: …`;
 * an expired outcome's: the action already ran at T, was not performed again, its result is no
 * longer kept, and how to do it again with a new `idempotency_key`), and `_meta` for programs:
 * `dev.idemgate/verdict` (`expired`, `unknown`...), `dev.idemgate/problem` (the problem type),
 * and the answer's facts (`executed_at` and `fence` of an expired outcome, `fence` and `since`
 * of an unknown one, `retry_after_secs` and `since` of one in flight). */
function refused(e) {
  const p = e.problem ?? {};
  const meta = { 'dev.idemgate/verdict': e.verdict, 'dev.idemgate/problem': p.type ?? null };
  if (p.executed_at != null) meta['dev.idemgate/executed_at'] = p.executed_at;
  if (p.fence != null) meta['dev.idemgate/fence'] = p.fence;
  if (p.since != null) meta['dev.idemgate/since'] = p.since;
  if (p.retry_after != null) meta['dev.idemgate/retry_after_secs'] = Math.max(1, Math.floor(p.retry_after));
  return { ...errorResult(refusalText(e)), _meta: meta };
}

/** A stored result replayed: marked in `_meta`, and told in words (the model reads content). */
function replayed(stored, result, rule) {
  const out = { ...(stored ?? {}) };
  out._meta = {
    ...(out._meta ?? {}),
    'dev.idemgate/replayed': true,
    'dev.idemgate/executed_at': result.executedAt ? result.executedAt.toISOString() : null,
    'dev.idemgate/rule': rule,
  };
  out.content = [...(out.content ?? []), { type: 'text', text: `idemgate: ${result.forModel}` }];
  return out;
}

/** The scopes of connections without an MCP session (stdio, in-memory), by transport: a
 * connection is one client, so it is that client's conversation. */
const connections = new WeakMap();

/** The scope of a call, as `idemgate mcp` names it: the conversation the client names in
 * `_meta` (`conversation:` + id, the kit's `Scope::conversation`, so both doors and every
 * process sharing the store name it alike); else the MCP session; else, for Streamable HTTP
 * without a session (whose transport may serve many clients), the request itself; else the
 * connection (stdio: the one client that started this server). Never a scope two clients share
 * unless they name the same conversation. */
function callScope(server, meta, extra) {
  const conversation = meta[CONVERSATION_META];
  if (conversation != null && conversation !== '') return `conversation:${conversation}`;
  if (extra?.sessionId) return `session:${extra.sessionId}`;
  const transport = server.server?.transport;
  if (extra?.requestInfo !== undefined || !transport) return freshScope();
  let s = connections.get(transport);
  if (s === undefined) {
    s = `session:${randomUUID()}`;
    connections.set(transport, s);
  }
  return s;
}

/** The params of each `tools/call` request, by the `extra` its tool callback gets: the SDK's
 * request schema drops params it does not know (`params.idempotencyKey`, an orchestration key
 * `idemgate mcp` reads too) before a tool sees them, so the raw request is looked at first. */
const requestParams = new WeakMap();

/** Wraps the server's raw `tools/call` handler (installed by the first `registerTool`) to keep
 * each request's params. The SDK keeps handlers in `Protocol._requestHandlers`; without it
 * (another SDK version) only `_meta` carries an orchestration key. */
function keepParams(server) {
  const handlers = server.server?._requestHandlers;
  const raw = handlers instanceof Map ? handlers.get('tools/call') : undefined;
  if (typeof raw !== 'function' || raw.idemgateKeepsParams) return;
  const kept = (request, extra) => {
    if (extra !== null && typeof extra === 'object') requestParams.set(extra, request?.params ?? {});
    return raw(request, extra);
  };
  kept.idemgateKeepsParams = true;
  handlers.set('tools/call', kept);
}

/** A key as the kit takes it: a non-empty string, else none. */
const keyText = (v) => (v == null || v === '' ? null : String(v));

function makeGate(z) {
  /** `server` (an `McpServer`) with its `registerTool` gated for the tools registered after:
   * every tool is a write unless its policy (`tools[name]`, else the engine's) says `read` or
   * `natural_idempotent`. A call's action is named by the kit's one rule (`nameAction`), from:
   * the orchestration layer's key (`params._meta["dev.idemgate/idempotency-key"]` or
   * `params.idempotencyKey`) or the program's `key(args, extra)`, which name the action in every
   * session; else the framework's tool-call id (`params._meta["dev.idemgate/tool-call-id"]`),
   * within the call's scope, with the window; else the model's `idempotency_key` argument (added to the tool's input schema,
   * optional and nullable), within the call's scope (`scope(args, extra)`, else `callScope`),
   * a new value repeating an action on purpose; else, when the tool's policy sets a `window`, an
   * identical call in the scope within it (the model re-emitting a call), and without a window
   * the call is refused, telling the model what to send. A replay is the stored result with
   * `_meta["dev.idemgate/replayed"]` and a text block saying so; a refusal (an expired outcome,
   * an unknown one...) is an error result in the kit's words for a model, its facts in `_meta`
   * (`refused`). */
  return function gateTools(engine, server, { tools = {}, key, scope } = {}) {
    const register = server.registerTool.bind(server);
    server.registerTool = (name, config, cb) => {
      const given = policyFields(tools[name]);
      const policy = engine.policy(name, given);
      if ((policy.kind ?? 'write') !== 'write') return register(name, config, cb);
      const shape = config.inputSchema;
      if (shape !== undefined && (typeof shape !== 'object' || typeof shape.parse === 'function')) {
        throw new TypeError(`gateTools: the tool ${name}'s inputSchema must be a zod raw shape ({field: z.string(), ...})`);
      }
      const declared = shape !== undefined && KEY_ARGUMENT in shape;
      const inputSchema = declared ? shape : { ...(shape ?? {}), [KEY_ARGUMENT]: zodKeyArgument(z) };
      const registered = register(name, { ...config, inputSchema }, async (input, extra) => {
        const [modelKey, rest] = splitModelKey(input ?? {}, true);
        const args = declared ? input : rest;
        const payload = jsonable(rest);
        const meta = extra?._meta ?? {};
        let action;
        try {
          action = nameAction({
            scope: keyText((scope ? scope(payload, extra) : null) ?? callScope(server, meta, extra)),
            orchestrationKey: keyText(meta[KEY_META] ?? requestParams.get(extra)?.idempotencyKey),
            businessKey: key ? keyText(key(payload, extra)) : null,
            modelKey: keyText(modelKey),
            callId: keyText(meta[CALL_ID_META]),
          });
        } catch (e) {
          return errorResult(`idemgate: ${e.message}; nothing was done.`);
        }
        // No key at all: the window only when the tool's policy sets one (`idemgate mcp`'s
        // on_missing_key = "window"); else the engine refuses the call (key_required), saying
        // what to send.
        if (action.rule === 'window' && engine.policy(name, given).fallbackWindow == null) {
          action = { ...action, window: false };
        }
        let first = null;
        const run = async () => {
          first = await cb(args, extra);
          return first;
        };
        let out;
        try {
          out = await callOnce(engine, name, action, payload, run, given, extra?.signal);
        } catch (e) {
          if (e instanceof Failed) return errorResult(`${name} failed: ${JSON.stringify(e.result)}`);
          if (e instanceof NotApplied || e instanceof MaybeApplied) return errorResult(`${name}: ${e.message}`);
          if (e instanceof IdemgateError) return refused(e);
          throw e;
        }
        if (out.repeatOf !== null) return replayed(out.repeatOf.value, out.repeatOf, 'fallback');
        if (out.result.executed && first !== null) return first;
        return replayed(out.result.value, out.result, out.result.rule ?? 'explicit');
      });
      keepParams(server);
      return registered;
    };
    return server;
  };
}

module.exports = { makeGate, KEY_META, CALL_ID_META, CONVERSATION_META };
