// Types of `idemgate/ai`, the Vercel AI SDK adapter.
import type { Engine, PolicyOptions } from './index.js';

export interface IdempotentToolOptions extends PolicyOptions {
  /** The conversation the call belongs to (default: `options.context?.conversationId`, else the
   * conversation told by the message objects the SDK hands the tool; never global). */
  scope?: string | ((input: any, options: any) => string | null | undefined);
  /** Names the action by its business identity instead of the tool-call id. */
  key?: (input: any, options: any) => string | null | undefined;
  /** Adds the model's optional `idempotency_key` argument to the schema (default true). */
  modelKey?: boolean;
}

/** The AI SDK tool `def`, its `execute` run once per action through `engine` under `name`. An
 * idemgate refusal (`OutcomeExpired`, `OutcomeUnknown`...) is thrown: the call's `tool-error`
 * part holds it, and the model reads `String(error)`, the kit's words for a model. */
export declare function idempotentTool<T extends { execute?: (...args: any[]) => any }>(
  engine: Engine,
  name: string,
  def: T,
  options?: IdempotentToolOptions,
): T;

/** `schema` (zod object or `jsonSchema()`) with the model's optional, nullable `idempotency_key`. */
export declare function withKeyArgument<S>(schema: S): S;
