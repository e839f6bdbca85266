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

/** `inner` as a tool of the same name whose calls run once per action through `engine`. An
 * idemgate refusal (`OutcomeExpired`, `OutcomeUnknown`...) of a model's tool call answers it with
 * a ToolMessage of status `error`: the kit's words for a model as its content, the error as its
 * `artifact`; invoked with plain arguments, the tool throws it. */
export declare function idempotentLangChainTool<T extends { name: string; invoke: (...args: any[]) => any }>(
  engine: Engine,
  inner: T,
  options?: IdempotentLangChainToolOptions,
): T;
