// Types of `idemgate/mcp`, the MCP TypeScript SDK server adapter.
import type { Engine, PolicyOptions } from './index.js';

export declare const KEY_META: 'dev.idemgate/idempotency-key';
export declare const CONVERSATION_META: 'dev.idemgate/conversation';

export interface GateOptions {
  /** Policies by tool name (a tool not listed is a write with the engine's policy). */
  tools?: Record<string, PolicyOptions>;
  /** Names a call's action by its business identity. */
  key?: (args: any, extra: any) => string | null | undefined;
  /** The scope of the re-emission window (default: `_meta` conversation, else the session). */
  scope?: (args: any, extra: any) => string | null | undefined;
}

/** `server` with `registerTool` gated for the tools registered after. */
export declare function gateTools<S extends { registerTool: (...args: any[]) => any }>(
  engine: Engine,
  server: S,
  options?: GateOptions,
): S;
