// Types of `idemgate/openai-agents`, the OpenAI Agents SDK for JS adapter.
import type { Engine, IdemgateError, PolicyOptions } from './index.js';

export interface IdempotentFunctionToolOptions extends PolicyOptions {
  /** The conversation (default: `runContext.context?.conversationId`, else the run; never global). */
  scope?: string | ((input: any, runContext: any) => string | null | undefined);
  /** Names the action by its business identity instead of the call id. */
  key?: (input: any, runContext: any) => string | null | undefined;
  /** Adds the model's optional, nullable `idempotency_key` parameter (default true). */
  modelKey?: boolean;
  /** Gets an idemgate refusal (`OutcomeExpired`, `OutcomeUnknown`, `InFlight`, `KeyReused`...),
   * as the SDK's `tool({ errorFunction })` gets a tool's error: the model reads what it returns;
   * throwing ends the run. Default: the kit's words for a model (`idemgate: …`). */
  errorFunction?: (runContext: any, error: IdemgateError, details?: any) => string | Promise<string>;
}

/** The function tool `fnTool`, its calls run once per action through `engine`. */
export declare function idempotentFunctionTool<T extends { name: string; invoke: (...args: any[]) => any }>(
  engine: Engine,
  fnTool: T,
  options?: IdempotentFunctionToolOptions,
): T;
