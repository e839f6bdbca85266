// Types of `idemgate/openai-agents`, the OpenAI Agents SDK for JS adapter.
import type { Engine, PolicyOptions } from './index.js';

export interface IdempotentFunctionToolOptions extends PolicyOptions {
  /** The conversation (default: `runContext.context?.conversationId`, else the run; never global). */
  scope?: string | ((input: any, runContext: any) => string | null | undefined);
  /** Names the action by its business identity instead of the call id. */
  key?: (input: any, runContext: any) => string | null | undefined;
  /** Adds the model's optional, nullable `idempotency_key` parameter (default true). */
  modelKey?: boolean;
}

/** The function tool `fnTool`, its calls run once per action through `engine`. */
export declare function idempotentFunctionTool<T extends { name: string; invoke: (...args: any[]) => any }>(
  engine: Engine,
  fnTool: T,
  options?: IdempotentFunctionToolOptions,
): T;
