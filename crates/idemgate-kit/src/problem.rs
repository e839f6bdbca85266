//! The problem document (RFC 9457) of every answer that is not a result and every refusal: its
//! type, title and status from the verdict's codes, its detail and members from the
//! [`Explanation`]. The gateway sends it as `application/problem+json`, the in-process packages
//! put it on the errors they raise, the MCP proxy names its type in `_meta`: each only formats it.

use idemgate_core::Verdict;
use serde_json::{json, Map, Value};

use crate::codes::{problem_type, VerdictCodes};
use crate::explain::{Door, Explanation, What, MODEL_REPEAT};
use crate::refusal::Refusal;

/// A problem document, before a door writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    /// The verdict: the type, title and status.
    pub verdict: Verdict,
    /// For a person: the document's `detail`.
    pub detail: String,
    /// For a model, when the problem comes of an explanation.
    pub for_model: Option<String>,
    /// The facts, beside `type`, `title`, `status` and `detail`: the record's `key` (unless the
    /// door is discreet) and `rule`; `since`, `retry_after`, `fence`, `ran_here`, `message`,
    /// `executed_at`, `expired_at`, `retain_until`, `first_seen`, `state`, where they apply.
    pub members: Map<String, Value>,
}

impl Problem {
    /// A problem of a door's own, with no explanation behind it (a store that did not open).
    pub fn new(verdict: Verdict, detail: impl Into<String>) -> Self {
        Problem {
            verdict,
            detail: detail.into(),
            for_model: None,
            members: Map::new(),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.verdict.http_status()
    }

    /// The last part of the type URI.
    pub fn name(&self) -> &'static str {
        self.verdict.problem().0
    }

    /// The title.
    pub fn title(&self) -> &'static str {
        self.verdict.problem().1
    }

    /// The type URI.
    pub fn type_uri(&self) -> String {
        problem_type(self.name())
    }

    /// The whole document, as the in-process packages carry it: `type`, `title`, `status`,
    /// `detail`, the verdict's label (`verdict`), `for_model` when there is one, and the members.
    pub fn document(&self) -> Map<String, Value> {
        let mut doc = Map::new();
        doc.insert("type".into(), self.type_uri().into());
        doc.insert("title".into(), self.title().into());
        doc.insert("status".into(), self.status().into());
        doc.insert("detail".into(), self.detail.clone().into());
        doc.insert("verdict".into(), self.verdict.label().into());
        if let Some(text) = &self.for_model {
            doc.insert("for_model".into(), text.clone().into());
        }
        doc.extend(self.members.clone());
        doc
    }
}

impl Explanation {
    /// The problem document of this explanation, as `door` names things: its detail for a person,
    /// its words for a model (told to repeat an action with [`MODEL_REPEAT`]), its facts as
    /// members.
    pub fn problem(&self, door: &Door<'_>) -> Problem {
        Problem {
            verdict: self.verdict,
            detail: self.for_person(door),
            for_model: Some(self.for_model(&Door {
                repeat: MODEL_REPEAT,
                ..*door
            })),
            members: self.members(door),
        }
    }

    fn members(&self, door: &Door<'_>) -> Map<String, Value> {
        let mut m = Map::new();
        if let (Some(key), false) = (&self.key, door.discreet) {
            m.insert("key".into(), key.key.as_str().into());
        }
        if let Some(rule) = self.rule {
            m.insert("rule".into(), rule.to_string().into());
        }
        let mut add = |name: &str, value: Value| {
            m.insert(name.to_owned(), value);
        };
        match &self.what {
            What::InFlight { since, retry_after } => {
                add("since", json!(since));
                add("retry_after", json!(retry_after.as_secs_f64()));
            }
            What::Unknown {
                since,
                fence,
                ran_here,
                why,
            } => {
                add("since", json!(since));
                add("fence", json!(fence));
                add("ran_here", json!(ran_here));
                add("message", json!(why));
            }
            What::Expired {
                at,
                expired_at,
                until,
                fence,
            } => {
                add("executed_at", json!(at));
                add("expired_at", json!(expired_at));
                add("retain_until", json!(until));
                add("fence", json!(fence));
            }
            What::Refused(Refusal::KeyReused { first_seen }) => {
                add("first_seen", json!(first_seen));
            }
            What::Refused(Refusal::NotSettleable { state, fence, .. }) => {
                add("state", json!(state.to_string()));
                add("fence", json!(fence));
            }
            What::Ran { .. }
            | What::Replayed { .. }
            | What::PassedThrough
            | What::NotApplied { .. }
            | What::Refused(
                Refusal::KeyRequired { .. }
                | Refusal::Invalid { .. }
                | Refusal::Store { .. }
                | Refusal::LeaseLost
                | Refusal::NotFound
                | Refusal::Journal { .. }
                | Refusal::Other { .. },
            ) => {}
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use idemgate_core::{
        Answer, Decision, EngineError, IdempotencyKey, Key, KeyRule, State, StoreError, TenantId,
        Timestamp, ToolName,
    };

    use super::*;
    use crate::explain::Resolve;

    fn key() -> Key {
        Key::new(
            TenantId::new("acme").unwrap(),
            ToolName::new("charge").unwrap(),
            IdempotencyKey::new("order-42").unwrap(),
        )
    }

    fn door(discreet: bool) -> Door<'static> {
        Door {
            effect: "the function",
            record: if discreet {
                "this key"
            } else {
                "acme/charge/order-42"
            },
            resolve: Resolve::Python,
            repeat: "call it again with a new key",
            add_key: "pass key=",
            discreet,
        }
    }

    #[test]
    fn a_reused_key_names_its_key_rule_and_first_sighting_unless_the_door_is_discreet() {
        let first_seen = Timestamp::from_millis(1_700_000_000_000);
        let reused = Explanation::of_error(&EngineError::KeyReuse {
            key: key(),
            rule: KeyRule::Explicit,
            first_seen,
        });
        let told = reused.problem(&door(false));
        assert_eq!(
            told.members,
            json!({"key": "order-42", "rule": "explicit", "first_seen": first_seen})
                .as_object()
                .unwrap()
                .clone()
        );
        assert_eq!(told.status(), 422);
        assert_eq!(
            told.document()["type"],
            "https://idemgate.dev/problems/key-reused"
        );
        assert!(told.detail.contains("acme/charge/order-42"), "{told:?}");
        let discreet = reused.problem(&door(true));
        assert!(!discreet.members.contains_key("key"), "{discreet:?}");
        assert!(!discreet.detail.contains("order-42"), "{discreet:?}");
        assert!(!format!("{:?}", discreet.for_model).contains("order-42"));
    }

    #[test]
    fn a_record_the_store_cannot_read_is_named_at_every_door_and_the_store_s_insides_only_at_some()
    {
        let why = "record acme/charge/order-42: its outcome is sealed under key id \"k1\", which the keyring does not hold";
        let unreadable =
            Explanation::of_error(&EngineError::ReserveFailed(StoreError::Corrupt(why.into())));
        for discreet in [false, true] {
            let p = unreadable.problem(&door(discreet));
            assert_eq!((p.status(), p.name()), (503, "store-unavailable"));
            assert!(
                p.detail.contains("nothing ran") && p.detail.contains(why),
                "{}",
                p.detail
            );
            assert!(!p.detail.contains("try again later"), "{}", p.detail);
            let model = p.for_model.unwrap();
            assert!(model.contains("key id \"k1\"") && model.contains("tell the user"));
        }
        let down = Explanation::of_error(&EngineError::ReserveFailed(StoreError::Unavailable(
            "connect to 10.0.0.5:5432 refused".into(),
        )));
        assert!(down.problem(&door(false)).detail.contains("10.0.0.5"));
        let discreet = down.problem(&door(true)).detail;
        assert_eq!(
            discreet,
            "failed to reserve the key, so nothing ran; try again later"
        );
    }

    #[test]
    fn a_record_in_the_wrong_state_says_its_state_and_fence() {
        let refused = Explanation::of_error(&EngineError::NotReopenable {
            key: key(),
            state: State::InFlight,
            fence: 3,
        });
        let p = refused.problem(&door(true));
        assert_eq!((p.status(), p.name()), (409, "not-resolvable"));
        assert_eq!(p.members["state"], "in_flight");
        assert_eq!(p.members["fence"], 3);
        assert!(p.detail.contains("wait until it finishes"), "{}", p.detail);
    }

    #[test]
    fn an_answer_s_facts_are_its_members() {
        let answer = Answer {
            key: Some(key()),
            rule: Some(KeyRule::Explicit),
            decision: Decision::Expired {
                executed_at: Timestamp::from_millis(1_000),
                expired_at: Timestamp::from_millis(2_000),
                retain_until: Timestamp::from_millis(3_000),
                fence: 4,
            },
        };
        let p = Explanation::of_answer(&answer).problem(&door(false));
        let doc = p.document();
        for (name, value) in [
            ("key", json!("order-42")),
            ("rule", json!("explicit")),
            ("verdict", json!("expired")),
            ("status", json!(410)),
            ("executed_at", json!("1970-01-01T00:00:01.000Z")),
            ("fence", json!(4)),
        ] {
            assert_eq!(doc[name], value, "{name}");
        }
        assert!(doc["for_model"]
            .as_str()
            .unwrap()
            .contains("idempotency_key set to a new value"));
    }
}
