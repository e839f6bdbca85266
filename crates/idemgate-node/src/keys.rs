//! The addon's functions on keys, fingerprints and verdicts, for the package and its tests.

use idemgate::{IdempotencyKey, Verdict};
use napi::{Error, Result};
use napi_derive::napi;

/// A stable key for one step of one run: `IdempotencyKey::derive(run_id, step)`, the same as the
/// Python package's `derive_key`.
#[napi]
pub fn derive_key(run_id: String, step: String) -> Result<String> {
    IdempotencyKey::derive(&run_id, &step)
        .map(|k| k.as_str().to_owned())
        .map_err(|e| {
            Error::from_reason(format!(
                "{e}: deriveKey needs the run id and the step that name this step of this run"
            ))
        })
}

/// What a door knows of one call, as `nameAction` takes it (`idemgate_kit::identity::Facts`).
#[napi(object)]
#[derive(Default)]
pub struct ActionFacts {
    /// The conversation, thread, session, run or invocation the call was made in.
    pub scope: Option<String>,
    /// A key of the orchestration layer (`_meta`, a header).
    pub orchestration_key: Option<String>,
    /// The program's business key (`key:` of the adapters).
    pub business_key: Option<String>,
    /// The model's `idempotency_key` argument.
    pub model_key: Option<String>,
    /// The framework's tool-call id.
    pub call_id: Option<String>,
}

/// The name of a call's action (`idemgate_kit::identity::Identity`).
#[napi(object)]
pub struct ActionName {
    /// The record's key; null when the window alone names the call.
    pub key: Option<String>,
    /// The scope the record keeps and the window joins.
    pub scope: Option<String>,
    /// The rule that named it: `orchestration_key`, `business_key`, `model_key`, `call_id` or
    /// `window`.
    pub rule: String,
    /// Whether an identical call in the scope within the window is the same action.
    pub window: bool,
}

/// Names a call's action from its facts: the one rule of every door (`idemgate_kit::identity`);
/// throws when a key is invalid, or the program's keys differ; a call without a scope is its own invocation
/// (`identify_or_invocation`), never global.
#[napi]
pub fn name_action(facts: ActionFacts) -> Result<ActionName> {
    let i = idemgate_kit::identity::identify_or_invocation(&idemgate_kit::identity::Facts {
        scope: facts.scope.as_deref(),
        orchestration_key: facts.orchestration_key.as_deref(),
        business_key: facts.business_key.as_deref(),
        model_key: facts.model_key.as_deref(),
        call_id: facts.call_id.as_deref(),
    })
    .map_err(|e| Error::from_reason(e.to_string()))?;
    Ok(ActionName {
        key: i.key.map(|k| k.as_str().to_owned()),
        scope: i.scope.map(|s| s.to_string()),
        rule: i.rule.as_str().to_owned(),
        window: i.window,
    })
}

/// A scope of its own for one invocation of a tool whose framework names no conversation.
#[napi]
pub fn invocation_scope() -> String {
    idemgate_kit::identity::Scope::invocation()
}

/// A fresh random key: `IdempotencyKey::mint()`.
#[napi]
pub fn mint_key() -> String {
    IdempotencyKey::mint().as_str().to_owned()
}

/// A caller's key as the engine takes it (`IdempotencyKey::explicit`); throws with the reason.
#[napi]
pub fn check_key(key: String) -> Result<String> {
    IdempotencyKey::explicit(&key)
        .map(|k| k.as_str().to_owned())
        .map_err(|e| Error::from_reason(e.to_string()))
}

/// The fingerprint (hex SHA-256 of the canonical JSON) of a call's arguments given as JSON text.
#[napi]
pub fn fingerprint(args_json: String) -> Result<String> {
    idemgate::Fingerprint::of_json_text(args_json.as_bytes())
        .map(|f| f.to_hex())
        .map_err(|e| Error::from_reason(e.to_string()))
}

/// Every verdict label an answer may carry, with whether it is an error: what the package's
/// table of error classes is checked against.
#[napi]
pub fn verdict_labels() -> Vec<Vec<String>> {
    Verdict::ALL
        .into_iter()
        .map(|v| vec![v.label().to_owned(), v.is_error().to_string()])
        .collect()
}
