'use strict';
// What every framework adapter shares (the Python package's integrations/_tool_calls.py): how a
// tool call's logical action is named (the framework's tool-call id within its scope, the
// re-emission window, the model's and the program's keys) and how a tool function is run once
// per action through the in-process engine.
const native = require('./native.cjs');
const { currentKey, withCurrentKey, jsonText, POLICY_FIELDS } = require('./engine.cjs');
const { IdemgateError, LeaseLost, NotApplied, OutcomeNotRecorded } = require('./errors.cjs');

/** The tool argument a model sets to name a new action (a deliberate repeat), as `idemgate mcp`
 * reads it. */
const KEY_ARGUMENT = 'idempotency_key';

/** How the model is told what the `idempotency_key` argument is for. */
const KEY_DESCRIPTION =
  'Leave empty. Only to do an action again on purpose that was already done with the same ' +
  'arguments: a new value that names the new action.';

/** The re-emission window when a tool's policy sets none, in seconds: an identical write in one
 * scope within it is taken for the same action; `window: 0` turns it off. */
const DEFAULT_WINDOW = 60;

/** The key of a tool call's action: its call id within its scope (`nameAction`); without a
 * scope, within this one invocation (a key no other call shares). */
const scopedKey = (scope, callId) => nameAction({ callId, scope }).key;

/** A scope of its own (128 random bits, the kit's `Scope::invocation`): what an adapter names a
 * run or conversation by when its framework hands the tool only an object that stands for it. */
const freshScope = () => native.invocationScope();

/** A scope per object, kept as long as the object lives: `scopeOf(run)` is the same for every
 * call that hands over the same object, and no other call ever gets it. */
function scopesByObject() {
  const scopes = new WeakMap();
  return (o) => {
    if (o === null || typeof o !== 'object') return null;
    let s = scopes.get(o);
    if (s === undefined) {
      s = freshScope();
      scopes.set(o, s);
    }
    return s;
  };
}

/** The JSON schema of the model's key argument: optional (never listed as required) and
 * nullable (strict-mode models send null for "none"). */
const keyProperty = () => ({ type: ['string', 'null'], description: KEY_DESCRIPTION });

/** The model's key argument as a schema of `z` (zod 3 or 4): an optional, nullable string with
 * its description. Zod 4 before 4.2 keeps `.describe()` in a registry of its own copy, which a
 * library bundling another zod (LangChain.js 1.x bundles zod 4.6) never reads: the model would
 * not see "Leave empty". So the description is also put in the registry zod 4.2+ copies share
 * (`globalThis.__zod_globalRegistry`), which those libraries read. Zod 3 keeps it in the schema. */
function zodKeyArgument(z) {
  const schema = z.string().nullable().optional().describe(KEY_DESCRIPTION);
  const shared = globalThis.__zod_globalRegistry;
  if (schema._zod !== undefined && shared && typeof shared.add === 'function' && !shared.has(schema)) {
    shared.add(schema, { description: KEY_DESCRIPTION });
  }
  return schema;
}

/** Names a call's action by the one rule every door shares (the addon's `nameAction`,
 * `idemgate_kit::identity`; `name_action` in Python): `{key, scope, rule, window, callId}`.
 * - `orchestrationKey` (an MCP `_meta` key) or `businessKey` (the program's `key`): the action
 *   itself, in every conversation; no window.
 * - `modelKey` (the model's `idempotency_key` argument): a new action the model named, within
 *   the scope; no window: how the model repeats an action on purpose.
 * - else the framework's `callId` within the scope (the same id in another conversation is
 *   another action), with the window joining a re-emission of the action under a new id.
 * A call whose framework names no scope is its own invocation: never global. */
function nameAction({ callId = null, scope = null, businessKey = null, modelKey = null, orchestrationKey = null }) {
  // `callId` is kept beside the action for the call's span (gen_ai.tool.call.id).
  const named = native.nameAction({
    scope: scope ?? undefined,
    orchestrationKey: orchestrationKey ?? undefined,
    businessKey: businessKey ?? undefined,
    modelKey: modelKey ?? undefined,
    callId: callId ?? undefined,
  });
  return { key: named.key ?? null, scope: named.scope ?? null, rule: named.rule, window: named.window, callId };
}

/** The re-emission window of a call in seconds (0: none): never without a scope. */
function windowOf(engine, tool, overrides, action) {
  if (!action.window || action.scope == null) return 0;
  const configured = engine.policy(tool, overrides).fallbackWindow;
  return configured ?? DEFAULT_WINDOW;
}

/** `value` as JSON data (what is stored and replayed, so the first answer and every replay are
 * the same data). */
const jsonable = (value) => JSON.parse(jsonText(value));

/** Runs `fn` once per action: the key's record, and inside it the window's record of (scope,
 * tool, arguments), always in that order. Resolves to `{result, repeatOf}`: the answer of the
 * action's record, and the window's replay when the call was taken for a repeat of an earlier
 * identical call. `signal`: the caller stops waiting; the call is recorded all the same. */
async function callOnce(engine, tool, action, args, fn, policy, signal) {
  const overrides = { ...policy, callId: action.callId ?? undefined };
  const run = async () => jsonable(await fn());
  const window = windowOf(engine, tool, overrides, action);
  if (!window) {
    // The scope goes along even here: a call without key or window then gets the engine's own
    // fallback window (a policy's `window`) within its scope only, never across conversations.
    const r = await engine.call(tool, action.key, args, run, { ...overrides, scope: action.scope, signal });
    return { result: r, repeatOf: null };
  }
  const inWindow = { ...overrides, window: undefined, fallbackWindow: window };
  const windowed = (f) => engine.call(tool, null, args, f, { ...inWindow, scope: action.scope });
  if (action.key == null) {
    const r = await engine.call(tool, null, args, run, { ...inWindow, scope: action.scope, signal });
    return { result: r, repeatOf: r.replayed ? r : null };
  }
  let w = null;
  let refused = null;
  const inKey = async () => {
    // The function runs under the key's record: it sees that record's downstream key.
    const key = currentKey();
    try {
      w = await windowed(() => withCurrentKey(key, run));
    } catch (e) {
      if (e instanceof OutcomeNotRecorded || e instanceof LeaseLost) throw e; // it ran
      if (e instanceof IdemgateError) {
        // Refused before anything ran: the key's record is released, the refusal is the answer.
        refused = e;
        throw new NotApplied(`the re-emission window refused the call: ${e.message}`);
      }
      throw e;
    }
    return w.value;
  };
  try {
    // The scope goes on the record too (operators and `idemgate scan --records` see where the
    // call was made); a key is not named by it.
    const r = await engine.call(tool, action.key, args, inKey, { ...overrides, scope: action.scope, signal });
    return { result: r, repeatOf: w !== null && w.replayed ? w : null };
  } catch (e) {
    if (e instanceof NotApplied && refused !== null) throw refused;
    throw e;
  }
}

/** What the model is handed: the value, or for any answer that did not run the tool now (a
 * replay of its call id or key, or a call taken for a repeat of an identical one) the value and
 * the kit's words that say so. Never a silent replay: a model that reused a call id or its own key
 * for a new action would otherwise believe it had done that action. */
function answer({ result, repeatOf }) {
  const replay = repeatOf ?? (result.replayed ? result : null);
  if (replay === null) return result.value;
  return `${JSON.stringify(result.value)}\n\nidemgate: ${replay.forModel ?? replay.explanation}`;
}

/** Whether `e` is idemgate's answer that the call was not run now (a refusal: the outcome
 * expired, is unknown or still in flight, the key was reused, no key was given, the store could
 * not be reached...), which the model must read in words. Not the errors of a call that ran
 * (`OutcomeNotRecorded`, `LeaseLost`): those stay the program's alone. */
function isRefusal(e) {
  return e instanceof IdemgateError && !(e instanceof OutcomeNotRecorded) && !(e instanceof LeaseLost);
}

/** What the model reads for a refusal: the kit's words for a model (`forModel`; the expired
 * answer's: the action already ran at T, was not performed again, its result is no longer kept,
 * and how to do it again on purpose with a new `idempotency_key`), else the error's message. */
const refusalText = (e) => `idemgate: ${e.forModel ?? e.message}`;

/** `e` (a refusal) as a framework that shows the model a thrown error's text (`String(e)`, as
 * the AI SDK does) shows it `refusalText(e)`; the error is otherwise the same (its class, its
 * message for a person, its problem document). */
function toldToModel(e) {
  const text = refusalText(e);
  Object.defineProperty(e, 'toString', { value: () => text, configurable: true, writable: true });
  return e;
}

/** The model's key of a call and its other arguments. */
function splitModelKey(input, modelKey) {
  if (!modelKey || input === null || typeof input !== 'object' || !(KEY_ARGUMENT in input)) {
    return [null, input];
  }
  const { [KEY_ARGUMENT]: given, ...rest } = input;
  return [given || null, rest];
}

/** The policy fields of an adapter's options (`window` included). */
function policyFields(options) {
  const policy = {};
  for (const f of [...POLICY_FIELDS, 'window']) if (options?.[f] !== undefined) policy[f] = options[f];
  return policy;
}

/** One call of a framework's tool through an adapter, once per action: the model's key taken out
 * of `input`; the conversation `options.scope(args, context)` (or a string), else
 * `defaultScope()` (the conversation or run as far as the framework lets the adapter tell it),
 * else the call's own invocation (`nameAction`), never global; the action named from `callId`
 * (or `options.key(args, context)`); `run(args)` the tool itself. Resolves to what the model is
 * handed. */
async function toolCall(engine, tool, input, context, options, { callId, defaultScope, signal, policy }, run) {
  const { scope, key, modelKey = true } = options;
  const [given, args] = splitModelKey(input, modelKey);
  const conversation = (typeof scope === 'function' ? scope(args, context) : scope) ?? defaultScope();
  const text = (v) => (v == null || v === '' ? null : String(v));
  const action = nameAction({
    callId: text(callId),
    scope: text(conversation),
    businessKey: key ? text(key(args, context)) : null,
    modelKey: text(given),
  });
  return answer(await callOnce(engine, tool, action, jsonable(args), () => run(args), policy, signal));
}

module.exports = {
  toolCall, policyFields,
  KEY_ARGUMENT, KEY_DESCRIPTION, DEFAULT_WINDOW, nameAction, scopedKey, windowOf, callOnce,
  answer, jsonable, splitModelKey, freshScope, scopesByObject, keyProperty, zodKeyArgument,
  isRefusal, refusalText, toldToModel,
};
