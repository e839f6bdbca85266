//! What counts as "the same action": the one place that names a call's record from what its door
//! knows. Every door and framework integration (the MCP proxy, the gateway, `exec`, the Python
//! and Node packages) hands its facts to [`identify`] and records the call under what it returns;
//! none of them derives a key, a scope or a window itself.
//!
//! The rules, in the order they apply (`docs/DESIGN.md`, "What names an action"):
//!
//! | the call carries | rule | record key | scope | window |
//! |---|---|---|---|---|
//! | a key from the orchestration layer (`_meta`, `params.idempotencyKey`, the `Idempotency-Key` header, `exec --key`) | [`Rule::OrchestrationKey`] | the key | none: it names the action everywhere | no |
//! | the program's business key (`key=`) | [`Rule::BusinessKey`] | the key | none | no |
//! | the model's `idempotency_key` argument | [`Rule::ModelKey`] | derived from (scope, key) | the call's | no |
//! | the framework's tool-call id | [`Rule::CallId`] | derived from (scope, id) | the call's | yes |
//! | nothing | [`Rule::Window`] | none: (scope, arguments) within the window | the call's | yes |
//!
//! Why: an orchestration or business key is chosen by a program that knows what the action is,
//! so it names it across conversations. A call id names a message, not an action (a model
//! re-emits an action under a new id, and some models send the same id in every conversation),
//! and a model's key is the model's guess: both are advisory, so they name an action only within
//! the scope the call was made in (contract rule 2), and a call id is backed by the re-emission
//! window. A model's key turns the window off: it is how the model repeats an action on purpose.
//!
//! Model-facing doors never go without a scope: when the framework exposes no conversation,
//! the door passes the run or the invocation ([`Scope::invocation`]); a call id or a model key
//! with no scope at all is refused ([`IdentityError::Unscoped`]) rather than read as global.

use std::fmt;
use std::sync::Arc;

use idemgate_core::{IdempotencyKey, KeyError, KeyRule};

/// The tool argument a model sets to name a new action (a deliberate repeat), in every door.
pub const MODEL_KEY_ARGUMENT: &str = "idempotency_key";

/// How the model is told what [`MODEL_KEY_ARGUMENT`] is for, in every schema a door shows it.
pub const MODEL_KEY_DESCRIPTION: &str = "Leave empty. Only to do an action again on purpose that was already done with the same arguments: a new value that names the new action.";

/// What a door knows about one call. Every field is optional: a door fills what it has.
#[derive(Clone, Copy, Debug, Default)]
pub struct Facts<'a> {
    /// Where the call was made: a conversation, thread, session, run or invocation
    /// (see [`Scope`] for the names the doors give them).
    pub scope: Option<&'a str>,
    /// A key chosen by the orchestration layer: `_meta["dev.idemgate/idempotency-key"]`,
    /// `params.idempotencyKey`, the `Idempotency-Key` header, `exec --key`.
    pub orchestration_key: Option<&'a str>,
    /// The program's business key (`key=` of the packages' decorators and adapters).
    pub business_key: Option<&'a str>,
    /// The model's `idempotency_key` argument.
    pub model_key: Option<&'a str>,
    /// The framework's tool-call id.
    pub call_id: Option<&'a str>,
}

/// Which rule named a call's action. Every answer can say it ("by which rule").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A key from the orchestration layer names the action, in every scope.
    OrchestrationKey,
    /// The program's business key names the action, in every scope.
    BusinessKey,
    /// The model's `idempotency_key`, within the call's scope.
    ModelKey,
    /// The framework's tool-call id, within the call's scope, backed by the window.
    CallId,
    /// No key: an identical call in the scope within the re-emission window.
    Window,
}

impl Rule {
    /// The rule's name on the wire (`_meta`, span attributes, the packages' `Action.rule`).
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::OrchestrationKey => "orchestration_key",
            Rule::BusinessKey => "business_key",
            Rule::ModelKey => "model_key",
            Rule::CallId => "call_id",
            Rule::Window => "window",
        }
    }

    /// The engine's rule for a call this rule named ([`Call::key_named_by`]): a program's key is
    /// the caller's ([`KeyRule::Explicit`]), the window's the engine's own ([`KeyRule::Fallback`]),
    /// and a model's key or a call id is said as such, so that its duplicates are counted under
    /// it.
    ///
    /// [`Call::key_named_by`]: idemgate_core::Call::key_named_by
    pub fn key_rule(self) -> KeyRule {
        match self {
            Rule::OrchestrationKey | Rule::BusinessKey => KeyRule::Explicit,
            Rule::ModelKey => KeyRule::ModelKey,
            Rule::CallId => KeyRule::CallId,
            Rule::Window => KeyRule::Fallback,
        }
    }

    /// Whether the action's name reaches across scopes (only a program's key does).
    pub fn crosses_scopes(self) -> bool {
        matches!(self, Rule::OrchestrationKey | Rule::BusinessKey)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name of a call's action: what the door records the call under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The record's key; `None` when the window alone names the call (the engine derives it from
    /// the scope and the arguments).
    pub key: Option<IdempotencyKey>,
    /// The scope the record keeps (and the window's); `None` only for keys that name the action
    /// everywhere, or a program's call without any key (the tenant is its scope).
    pub scope: Option<Arc<str>>,
    /// The rule that named it.
    pub rule: Rule,
    /// Whether an identical call in the same scope within the tool's window is the same action
    /// (the model re-emitting a call under a new id).
    pub window: bool,
}

/// Why a call's facts name no action.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// A key the call carries is not a key.
    #[error("the {source_name} is invalid: {error}")]
    BadKey {
        /// Which key, in words.
        source_name: &'static str,
        /// Why.
        error: KeyError,
    },
    /// The orchestration key and the business key differ: the call does not say which action
    /// it names.
    #[error("the idempotency key ({orchestration}) and the program's key ({business}) differ")]
    Conflict {
        /// The orchestration layer's key.
        orchestration: String,
        /// The program's key.
        business: String,
    },
    /// A call id or a model's key with no scope: it would name the same action in every
    /// conversation (a model's "1" or a constant call id would replay another's result).
    #[error("the {what} names an action only within a conversation, and this call names none; the door must pass the conversation, run or invocation the call was made in")]
    Unscoped {
        /// Which key, in words.
        what: &'static str,
    },
}

/// Names a call's action from its door's facts (the table in the module's documentation).
///
/// # Errors
/// [`IdentityError`] when a key is not a key, the program's keys disagree, or an advisory key
/// comes without a scope.
pub fn identify(facts: &Facts<'_>) -> Result<Identity, IdentityError> {
    let scope = facts.scope.filter(|s| !s.is_empty()).map(Arc::<str>::from);
    let explicit = |source_name, key: &str| {
        IdempotencyKey::explicit(key).map_err(|error| IdentityError::BadKey { source_name, error })
    };
    let orchestration = non_empty(facts.orchestration_key)
        .map(|k| explicit("idempotency key", k))
        .transpose()?;
    let business = non_empty(facts.business_key)
        .map(|k| explicit("program's key", k))
        .transpose()?;
    let global = |key, rule| Identity {
        key: Some(key),
        // A program's key names the action everywhere; the scope is kept on the record only so
        // operators can list a conversation's records.
        scope: scope.clone(),
        rule,
        window: false,
    };
    match (orchestration, business) {
        (Some(o), Some(b)) if o != b => {
            return Err(IdentityError::Conflict {
                orchestration: o.as_str().to_owned(),
                business: b.as_str().to_owned(),
            })
        }
        (Some(o), _) => return Ok(global(o, Rule::OrchestrationKey)),
        (None, Some(b)) => return Ok(global(b, Rule::BusinessKey)),
        (None, None) => {}
    }
    if let Some(model) = non_empty(facts.model_key) {
        let scope = scope.ok_or(IdentityError::Unscoped {
            what: "model's idempotency_key",
        })?;
        return Ok(Identity {
            key: Some(scoped(&scope, &format!("idempotency_key:{model}"))),
            scope: Some(scope),
            rule: Rule::ModelKey,
            window: false,
        });
    }
    if let Some(call_id) = non_empty(facts.call_id) {
        let scope = scope.ok_or(IdentityError::Unscoped {
            what: "tool-call id",
        })?;
        return Ok(Identity {
            key: Some(scoped(&scope, call_id)),
            scope: Some(scope),
            rule: Rule::CallId,
            window: true,
        });
    }
    Ok(Identity {
        key: None,
        window: scope.is_some(),
        scope,
        rule: Rule::Window,
    })
}

/// [`identify`] for a model-facing door whose framework may name no conversation: a call without
/// a scope is given one of its own invocation ([`Scope::invocation`]), so its call id or model key
/// names nothing outside this one call, and no window is kept for it (it could join nothing).
/// Never a global name.
///
/// # Errors
/// As [`identify`], but never [`IdentityError::Unscoped`].
pub fn identify_or_invocation(facts: &Facts<'_>) -> Result<Identity, IdentityError> {
    if facts.scope.is_some_and(|s| !s.is_empty()) {
        return identify(facts);
    }
    let invocation = Scope::invocation();
    let mut identity = identify(&Facts {
        scope: Some(&invocation),
        ..*facts
    })?;
    identity.window = false;
    Ok(identity)
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// The key of an advisory name within a scope. The scope is never empty here (checked above), so
/// the derivation cannot fail; it is the same derivation the packages used before this module, so
/// records keep their names.
fn scoped(scope: &str, name: &str) -> IdempotencyKey {
    IdempotencyKey::derive(scope, name).expect("scope and name are non-empty")
}

/// The names doors give scopes, so that two doors that know the same conversation name it alike
/// and one door's session can never equal another's conversation.
pub struct Scope;

impl Scope {
    /// A conversation the client or the application names (`_meta["dev.idemgate/conversation"]`,
    /// a framework's conversation or thread id).
    pub fn conversation(id: &str) -> String {
        format!("conversation:{id}")
    }

    /// A fresh scope of its own (128 random bits) named `kind`: an MCP session
    /// (`session`), a request of a client without sessions, one invocation of a framework that
    /// exposes no conversation (`invocation`). Nothing outside it is ever joined to it.
    ///
    /// # Panics
    /// When the operating system has no randomness to give, which std also treats as fatal.
    pub fn fresh(kind: &str) -> String {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("failed to read randomness from the operating system");
        format!("{kind}:{}", idemgate_core::key::hex(&bytes))
    }

    /// [`Scope::fresh`] for one invocation.
    pub fn invocation() -> String {
        Self::fresh("invocation")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(f: Facts<'_>) -> Identity {
        identify(&f).unwrap()
    }

    #[test]
    fn program_keys_name_the_action_in_every_scope() {
        for (scope, rule, f) in [
            (
                "conversation:a",
                Rule::OrchestrationKey,
                Facts {
                    orchestration_key: Some("order-1"),
                    call_id: Some("call-1"),
                    model_key: Some("m"),
                    ..Facts::default()
                },
            ),
            (
                "conversation:b",
                Rule::BusinessKey,
                Facts {
                    business_key: Some("order-1"),
                    call_id: Some("call-2"),
                    ..Facts::default()
                },
            ),
        ] {
            let i = named(Facts {
                scope: Some(scope),
                ..f
            });
            assert_eq!(i.key.as_ref().unwrap().as_str(), "order-1");
            assert_eq!(i.rule, rule);
            assert!(!i.window && rule.crosses_scopes());
        }
    }

    #[test]
    fn advisory_keys_are_scoped() {
        let in_scope = |scope, model_key, call_id| {
            named(Facts {
                scope: Some(scope),
                model_key,
                call_id,
                ..Facts::default()
            })
        };
        let a = in_scope("conversation:a", None, Some("call_1"));
        let b = in_scope("conversation:b", None, Some("call_1"));
        assert_ne!(
            a.key, b.key,
            "a constant call id in two conversations is two actions"
        );
        assert_eq!(a, in_scope("conversation:a", None, Some("call_1")));
        assert!(a.window && a.rule == Rule::CallId && !a.rule.crosses_scopes());

        let m = in_scope("session:1", Some("buy-2"), Some("call_9"));
        assert_eq!(m.rule, Rule::ModelKey);
        assert!(
            !m.window,
            "a model's key is how it repeats on purpose: no window"
        );
        assert_ne!(m.key, in_scope("session:2", Some("buy-2"), None).key);
        // A model's key never equals a call id that happens to read the same.
        assert_ne!(m.key, in_scope("session:1", None, Some("buy-2")).key);
    }

    #[test]
    fn advisory_keys_without_a_scope_are_refused() {
        for f in [
            Facts {
                call_id: Some("call_1"),
                ..Facts::default()
            },
            Facts {
                model_key: Some("k"),
                scope: Some(""),
                ..Facts::default()
            },
        ] {
            assert!(matches!(identify(&f), Err(IdentityError::Unscoped { .. })));
        }
    }

    #[test]
    fn no_key_is_the_window_of_the_scope() {
        let w = named(Facts {
            scope: Some("conversation:a"),
            ..Facts::default()
        });
        assert_eq!((w.key, w.rule, w.window), (None, Rule::Window, true));
        let tenant = named(Facts::default());
        assert!(tenant.scope.is_none() && !tenant.window);
    }

    #[test]
    fn bad_and_conflicting_keys_are_refused() {
        let e = identify(&Facts {
            orchestration_key: Some("fallback-1"),
            ..Facts::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        let e = identify(&Facts {
            orchestration_key: Some("a"),
            business_key: Some("b"),
            ..Facts::default()
        })
        .unwrap_err();
        assert!(matches!(e, IdentityError::Conflict { .. }), "{e}");
        assert!(identify(&Facts {
            orchestration_key: Some("a"),
            business_key: Some("a"),
            ..Facts::default()
        })
        .is_ok());
    }

    #[test]
    fn keys_are_the_ones_the_packages_derived_before() {
        // Records made before this module keep their names: the packages derived
        // `derive_key(scope, call_id)` and `derive_key(scope, "idempotency_key:" + key)`.
        let i = named(Facts {
            scope: Some("pydantic-ai/c1"),
            call_id: Some("call_1"),
            ..Facts::default()
        });
        assert_eq!(
            i.key.unwrap(),
            IdempotencyKey::derive("pydantic-ai/c1", "call_1").unwrap()
        );
    }

    #[test]
    fn an_unscoped_call_of_a_model_is_its_own_invocation() {
        let f = Facts {
            call_id: Some("call_1"),
            ..Facts::default()
        };
        let (a, b) = (
            identify_or_invocation(&f).unwrap(),
            identify_or_invocation(&f).unwrap(),
        );
        assert_ne!(
            a.key, b.key,
            "a constant call id never reaches another invocation"
        );
        assert!(a.scope.unwrap().starts_with("invocation:") && !a.window);
        let scoped = Facts {
            scope: Some("conversation:c"),
            ..f
        };
        assert_eq!(identify_or_invocation(&scoped), identify(&scoped));
    }

    #[test]
    fn fresh_scopes_never_meet() {
        assert_ne!(Scope::invocation(), Scope::invocation());
        assert!(Scope::fresh("session").starts_with("session:"));
        assert_eq!(Scope::conversation("c"), "conversation:c");
    }
}
