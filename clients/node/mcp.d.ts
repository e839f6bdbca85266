// Types of `idemgate/mcp`, the MCP TypeScript SDK server adapter.
import type { Engine, PolicyOptions } from './index.js';

export declare const KEY_META: 'dev.idemgate/idempotency-key';
/** Where a client sends the framework's tool-call id: the action within its conversation. */
export declare const CALL_ID_META: 'dev.idemgate/tool-call-id';
export declare const CONVERSATION_META: 'dev.idemgate/conversation';

export interface GateOptions {
  /** Policies by tool name (a tool not listed is a write with the engine's policy). */
  tools?: Record<string, PolicyOptions>;
  /** Names a call's action by its business identity, in every session. */
  key?: (args: any, extra: any) => string | null | undefined;
  /** The conversation of a call: the scope of the model's `idempotency_key` and of the
   * re-emission window (default: the `_meta` conversation, else the MCP session, else the stdio
   * connection, else the request). */
  scope?: (args: any, extra: any) => string | null | undefined;
}

/** `server` with `registerTool` gated for the tools registered after. A refusal is an `isError`
 * result in the kit's words for a model, with `_meta["dev.idemgate/verdict"]` (`expired`...),
 * `dev.idemgate/problem` and its facts (`executed_at`, `fence`, `since`, `retry_after_secs`). */
export declare function gateTools<S extends { registerTool: (...args: any[]) => any }>(
  engine: Engine,
  server: S,
  options?: GateOptions,
): S;
