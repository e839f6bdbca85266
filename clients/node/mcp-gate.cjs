'use strict';
// The MCP TypeScript SDK adapter's body (`idemgate/mcp`): `McpServer.registerTool` gated, as the
// Python package's FastMCP middleware and `idemgate mcp` gate a server's write tools. Built with
// the caller's zod (the ESM entry gives the ESM one, the CommonJS entry the CommonJS one), so the
// schema it extends and the SDK read one zod's registry of descriptions.
const { Failed, IdemgateError, MaybeApplied, NotApplied } = require('./errors.cjs');
const { KEY_ARGUMENT, KEY_DESCRIPTION, callOnce, jsonable, policyFields, splitModelKey } = require('./tool-calls.cjs');

/** Where MCP requests carry the idempotency key (`params._meta`), as `idemgate mcp` reads it. */
const KEY_META = 'dev.idemgate/idempotency-key';
/** Where MCP requests name their conversation (`params._meta`): the re-emission window's scope. */
const CONVERSATION_META = 'dev.idemgate/conversation';

const errorResult = (text) => ({ content: [{ type: 'text', text }], isError: true });

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

/** The scope of a call: the conversation the client names in `_meta`, else the MCP session. */
function sessionScope(meta, extra) {
  const conversation = meta[CONVERSATION_META];
  if (conversation != null) return String(conversation);
  return extra?.sessionId ? `session:${extra.sessionId}` : null;
}

function makeGate(z) {
  /** `server` (an `McpServer`) with its `registerTool` gated for the tools registered after:
   * every tool is a write unless its policy (`tools[name]`, else the engine's) says `read` or
   * `natural_idempotent`. A call's action is named as at `idemgate mcp`: the program's
   * `key(args, extra)` or the model's `idempotency_key` argument (added to the tool's input
   * schema; a new value repeats an action on purpose); else `params._meta["dev.idemgate/
   * idempotency-key"]`, with the re-emission window in the scope (`scope(args, extra)`, else
   * `_meta["dev.idemgate/conversation"]`, else the session) joining an identical call sent under
   * a new key; a call with no key at all gets the window only when its policy sets one, else it
   * is refused, telling the model what to send. A replay is the stored result with
   * `_meta["dev.idemgate/replayed"]` and a text block saying so. */
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
      const inputSchema = declared
        ? shape
        : { ...(shape ?? {}), [KEY_ARGUMENT]: z.string().optional().describe(KEY_DESCRIPTION) };
      return register(name, { ...config, inputSchema }, async (input, extra) => {
        const [modelKey, rest] = splitModelKey(input ?? {}, true);
        const args = declared ? input : rest;
        const payload = jsonable(rest);
        const meta = extra?._meta ?? {};
        const where = scope ? scope(payload, extra) : sessionScope(meta, extra);
        const business = key ? key(payload, extra) : null;
        let action;
        if (business != null || modelKey != null) {
          action = { key: String(business ?? modelKey), scope: null, window: false };
        } else if (meta[KEY_META] != null) {
          action = { key: String(meta[KEY_META]), scope: where, window: where != null };
        } else {
          const windowed = engine.policy(name, given).fallbackWindow != null;
          action = { key: null, scope: where, window: windowed && where != null };
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
          if (e instanceof IdemgateError) return errorResult(`idemgate: ${e.forModel ?? e.message}`);
          throw e;
        }
        if (out.repeatOf !== null) return replayed(out.repeatOf.value, out.repeatOf, 'fallback');
        if (out.result.executed && first !== null) return first;
        return replayed(out.result.value, out.result, out.result.rule ?? 'explicit');
      });
    };
    return server;
  };
}

module.exports = { makeGate, KEY_META, CONVERSATION_META };
