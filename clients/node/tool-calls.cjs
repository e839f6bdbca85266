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

/** The key of a tool call's action: its call id within its scope (`deriveKey`), or the call id
 * itself without a scope. */
const scopedKey = (scope, callId) => (scope != null ? native.deriveKey(scope, callId) : callId);

/** Names a call's action (`name_action` in Python): `{key, scope, window}`.
 * - `businessKey` (the program's `key`): the action itself, in every conversation; no window.
 * - `modelKey` (the model's `idempotency_key` argument): a new action the model named, scoped;
 *   no window: how the model repeats an action on purpose.
 * - else the framework's `callId`, scoped (the same id in another conversation is another
 *   action), with the window joining a re-emission of the action under a new id. */
function nameAction({ callId = null, scope = null, businessKey = null, modelKey = null }) {
  // `callId` is kept beside the action for the call's span (gen_ai.tool.call.id).
  if (businessKey != null) return { key: businessKey, scope: null, window: false, callId };
  if (modelKey != null) {
    return { key: scopedKey(scope, `${KEY_ARGUMENT}:${modelKey}`), scope, window: false, callId };
  }
  if (scope == null) return { key: callId, scope: null, window: false, callId };
  return { key: callId != null ? scopedKey(scope, callId) : null, scope, window: true, callId };
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
    return { result: await engine.call(tool, action.key, args, run, { ...overrides, signal }), repeatOf: null };
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
    const r = await engine.call(tool, action.key, args, inKey, { ...overrides, signal });
    return { result: r, repeatOf: w !== null && w.replayed ? w : null };
  } catch (e) {
    if (e instanceof NotApplied && refused !== null) throw refused;
    throw e;
  }
}

/** What the model is handed: the value, or for a call taken for a repeat, the value and the
 * kit's words that say so (a silent replay would let the model believe it did the action twice). */
function answer({ result, repeatOf }) {
  if (repeatOf === null) return result.value;
  return `${JSON.stringify(result.value)}\n\nidemgate: ${repeatOf.forModel}`;
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
 * of `input`, the conversation `options.scope(args, context)` (or a string, else
 * `defaultScope`), the action named from `callId` (or `options.key(args, context)`), `run(args)`
 * the tool itself; what the model is handed. */
async function toolCall(engine, tool, input, context, options, { callId, defaultScope, signal, policy }, run) {
  const { scope, key, modelKey = true } = options;
  const [given, args] = splitModelKey(input, modelKey);
  const conversation = typeof scope === 'function' ? scope(args, context) : (scope ?? defaultScope ?? null);
  const action = nameAction({
    callId: callId ?? null,
    scope: conversation ?? null,
    businessKey: key ? key(args, context) : null,
    modelKey: given,
  });
  return answer(await callOnce(engine, tool, action, jsonable(args), () => run(args), policy, signal));
}

module.exports = {
  toolCall, policyFields,
  KEY_ARGUMENT, KEY_DESCRIPTION, DEFAULT_WINDOW, nameAction, scopedKey, windowOf, callOnce,
  answer, jsonable, splitModelKey,
};
