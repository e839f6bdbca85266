// Types of `idemgate/langchain`, the LangChain.js adapter.
import type { Engine, PolicyOptions } from './index.js';

export interface IdempotentLangChainToolOptions extends PolicyOptions {
  /** The conversation (default: `config.configurable.thread_id`, else `config.metadata`'s
   * `thread_id`, `session_id` or `conversation_id`, else the call's own invocation). */
  scope?: string | ((input: any, config: any) => string | null | undefined);
  /** Names the action by its business identity instead of the tool call's id. */
  key?: (input: any, config: any) => string | null | undefined;
  /** Adds the model's optional, nullable `idempotency_key` argument (default true). */
  modelKey?: boolean;
}

/** `inner` as a tool of the same name whose calls run once per action through `engine`. */
export declare function idempotentLangChainTool<T extends { name: string; invoke: (...args: any[]) => any }>(
  engine: Engine,
  inner: T,
  options?: IdempotentLangChainToolOptions,
): T;
