//! What the server said about its tools in `tools/list`: the hints and the declared key parameter
//! the proxy needs. Everything else about a tool stays in the raw frame, untouched.

use std::collections::HashMap;

use idemgate_core::{ToolKind, ToolPolicy};
use serde::Deserialize;
use serde_json::value::RawValue;

use idemgate_kit::identity::{MODEL_KEY_ARGUMENT, MODEL_KEY_DESCRIPTION};

use crate::config::Config;
use crate::wire::frame::{self, Object};

/// The argument names a model or client may use to pass the idempotency key.
pub const KEY_ARGUMENTS: [&str; 2] = ["idempotency_key", "idempotencyKey"];

/// What the proxy knows of one tool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tool {
    /// `annotations.readOnlyHint`.
    pub read_only: bool,
    /// `annotations.idempotentHint`.
    pub idempotent: bool,
    /// The key argument its input schema declares, if any: the proxy leaves it in and fills it
    /// with the downstream key.
    pub key_argument: Option<String>,
    /// Whether it runs as a task (`execution.taskSupport` of MCP 2025-11-25): the proxy asks a
    /// legacy server for one on behalf of a modern client of the tasks extension.
    pub task_support: TaskSupport,
    /// Whether its structured output may carry a member more than its `outputSchema` names
    /// (no schema, or one without `additionalProperties: false`): a replay's notice can then go
    /// into `structuredContent` too, where clients that read only that channel see it.
    pub open_output: bool,
}

/// `execution.taskSupport` of a 2025-11-25 tool: absent is `forbidden`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskSupport {
    /// Never as a task.
    #[default]
    Forbidden,
    /// As a task when the caller asks.
    Optional,
    /// Only as a task: a call that does not ask for one is refused.
    Required,
}

/// The tools of one server, as far as `tools/list` answers showed them.
#[derive(Debug, Default)]
pub struct Catalog {
    tools: HashMap<String, Tool>,
    /// Whether a whole listing (every page) was seen, so an unknown name is really unknown.
    complete: bool,
}

#[derive(Deserialize)]
struct Listing {
    #[serde(default)]
    tools: Vec<Listed>,
    #[serde(rename = "nextCursor")]
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct Listed {
    name: String,
    #[serde(default)]
    annotations: Option<Annotations>,
    #[serde(rename = "inputSchema", default)]
    input_schema: Option<Schema>,
    #[serde(default)]
    execution: Option<Execution>,
    #[serde(rename = "outputSchema", default)]
    output_schema: Option<OutputSchema>,
}

#[derive(Deserialize)]
struct OutputSchema {
    #[serde(rename = "additionalProperties", default)]
    additional_properties: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Execution {
    #[serde(rename = "taskSupport", default)]
    task_support: Option<TaskSupport>,
}

#[derive(Deserialize)]
struct Annotations {
    #[serde(rename = "readOnlyHint", default)]
    read_only: Option<bool>,
    #[serde(rename = "idempotentHint", default)]
    idempotent: Option<bool>,
}

#[derive(Deserialize)]
struct Schema {
    #[serde(default)]
    properties: Option<HashMap<String, Box<RawValue>>>,
}

impl Catalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self::default()
    }

    /// Learns from one `tools/list` result page; returns its `nextCursor`. A result of another
    /// shape teaches nothing (the frame is relayed as it is either way).
    pub fn learn(&mut self, result: &RawValue) -> Option<String> {
        let listing: Listing = serde_json::from_str(result.get()).ok()?;
        for t in listing.tools {
            let annotations = t.annotations.as_ref();
            let key_argument = t
                .input_schema
                .and_then(|s| s.properties)
                .and_then(|p| KEY_ARGUMENTS.iter().find(|k| p.contains_key(**k)).copied())
                .map(str::to_owned);
            self.tools.insert(
                t.name,
                Tool {
                    read_only: annotations.and_then(|a| a.read_only).unwrap_or(false),
                    idempotent: annotations.and_then(|a| a.idempotent).unwrap_or(false),
                    key_argument,
                    task_support: t.execution.and_then(|e| e.task_support).unwrap_or_default(),
                    open_output: t.output_schema.is_none_or(|o| {
                        o.additional_properties != Some(serde_json::Value::Bool(false))
                    }),
                },
            );
        }
        if listing.next_cursor.is_none() {
            self.complete = true;
        }
        listing.next_cursor
    }

    /// The tool, if the server described it.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }

    /// The server said its tools changed (`notifications/tools/list_changed`): a name not seen
    /// yet is worth another listing.
    pub fn changed(&mut self) {
        self.complete = false;
    }

    /// Whether a whole listing was seen.
    pub fn is_complete(&self) -> bool {
        self.complete
    }
}

/// A `tools/list` result `page` in which every tool that `offer(name)` names (the writes the
/// proxy gates, which declare no key argument of their own) takes the model's
/// `idempotency_key`: optional, nullable, described. Without it in the schema the model cannot
/// send the argument the proxy's answers tell it to send (a strict-schema model, a server that
/// says `additionalProperties: false`). `None` when nothing was added (or the page is not a
/// listing); every other member is kept as the server wrote it.
pub(crate) fn offer_key_argument(
    page: &RawValue,
    offer: impl Fn(&str) -> bool,
) -> Option<Box<RawValue>> {
    let mut result = frame::object(page)?;
    let tools: Vec<Box<RawValue>> = serde_json::from_str(result.get("tools")?.get()).ok()?;
    let mut added = false;
    let tools: Vec<Box<RawValue>> = tools
        .into_iter()
        .map(|raw| {
            let with_key = frame::object(&raw).and_then(|mut tool| {
                let name = frame::string(&tool, "name")?;
                if !offer(&name) {
                    return None;
                }
                let mut schema = tool
                    .get("inputSchema")
                    .map_or_else(|| Some(Object::new()), |s| frame::object(s))?;
                let mut properties = schema
                    .get("properties")
                    .map_or_else(|| Some(Object::new()), |p| frame::object(p))?;
                if KEY_ARGUMENTS.iter().any(|k| properties.contains_key(*k)) {
                    return None;
                }
                properties.insert(
                    MODEL_KEY_ARGUMENT.to_owned(),
                    frame::raw(&serde_json::json!({
                        "type": ["string", "null"],
                        "description": MODEL_KEY_DESCRIPTION,
                    })),
                );
                if !schema.contains_key("type") {
                    schema.insert("type".to_owned(), frame::raw(&"object"));
                }
                schema.insert("properties".to_owned(), frame::raw(&properties));
                tool.insert("inputSchema".to_owned(), frame::raw(&schema));
                Some(frame::raw(&tool))
            });
            match with_key {
                Some(t) => {
                    added = true;
                    t
                }
                None => raw,
            }
        })
        .collect();
    if !added {
        return None;
    }
    result.insert("tools".to_owned(), frame::raw(&tools));
    Some(frame::raw(&result))
}

/// How a configured policy meets what the server said of a tool: here, with the catalog, so
/// that the configuration knows nothing of `tools/list`.
impl Config {
    /// The policy of `tool`, given what the server said about it (if it said anything).
    pub fn policy(&self, tool: &str, described: Option<&Tool>) -> ToolPolicy {
        if let Some(p) = self.tools.get(tool) {
            return p.clone();
        }
        let mut policy = self.default.clone();
        if self.profile.is_some_and(|p| p.reads(tool)) {
            policy.kind = ToolKind::Read;
            return policy;
        }
        if let (true, Some(t)) = (self.trusted, described) {
            if t.read_only {
                policy.kind = ToolKind::Read;
            } else if t.idempotent {
                policy.kind = ToolKind::NaturalIdempotent;
            }
        }
        policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_hints_and_declared_key_arguments() {
        let mut c = Catalog::new();
        let page = RawValue::from_string(
            r#"{"tools":[
                {"name":"search","annotations":{"readOnlyHint":true},"x-new":{"a":1}},
                {"name":"pay","inputSchema":{"type":"object","properties":{"idempotencyKey":{"type":"string"}}}},
                {"name":"put","annotations":{"idempotentHint":true},"inputSchema":{"type":"object"},"execution":{"taskSupport":"required"}}
            ],"nextCursor":"p2"}"#
                .into(),
        )
        .unwrap();
        assert_eq!(c.learn(&page).as_deref(), Some("p2"));
        assert!(!c.is_complete());
        assert!(c.get("search").unwrap().read_only);
        assert_eq!(
            c.get("pay").unwrap().key_argument.as_deref(),
            Some("idempotencyKey")
        );
        assert!(c.get("put").unwrap().idempotent);
        assert_eq!(c.get("put").unwrap().task_support, TaskSupport::Required);
        assert_eq!(c.get("pay").unwrap().task_support, TaskSupport::Forbidden);
        let last = RawValue::from_string(r#"{"tools":[]}"#.into()).unwrap();
        assert_eq!(c.learn(&last), None);
        assert!(c.is_complete());
    }

    #[test]
    fn gated_writes_are_offered_the_models_key() {
        let page = RawValue::from_string(
            r#"{"tools":[
                {"name":"buy","inputSchema":{"type":"object","properties":{"item":{"type":"string"}},"additionalProperties":false,"required":["item"]},"x":{"n":12345678901234567890}},
                {"name":"search","inputSchema":{"type":"object","properties":{"q":{"type":"string"}}}},
                {"name":"pay","inputSchema":{"type":"object","properties":{"idempotencyKey":{"type":"string"}}}},
                {"name":"ping"}
            ],"nextCursor":"c"}"#
                .into(),
        )
        .unwrap();
        let out = offer_key_argument(&page, |name| name != "search").unwrap();
        // Other members keep their exact text (big integers included).
        assert!(out.get().contains("12345678901234567890"), "{}", out.get());
        let out: serde_json::Value = serde_json::from_str(out.get()).unwrap();
        let tools = out["tools"].as_array().unwrap();
        let key = &tools[0]["inputSchema"]["properties"]["idempotency_key"];
        assert_eq!(key["type"], serde_json::json!(["string", "null"]));
        assert!(key["description"]
            .as_str()
            .unwrap()
            .starts_with("Leave empty"));
        assert_eq!(
            tools[0]["inputSchema"]["required"],
            serde_json::json!(["item"])
        );
        assert_eq!(tools[0]["inputSchema"]["additionalProperties"], false);
        assert!(
            tools[1]["inputSchema"]["properties"]
                .get("idempotency_key")
                .is_none(),
            "a read"
        );
        assert!(
            tools[2]["inputSchema"]["properties"]
                .get("idempotency_key")
                .is_none(),
            "declares its own"
        );
        assert!(tools[3]["inputSchema"]["properties"]
            .get("idempotency_key")
            .is_some());
        assert_eq!(out["nextCursor"], "c");
        let reads = offer_key_argument(&page, |_| false);
        assert!(reads.is_none(), "nothing to add: the page goes as it came");
    }

    #[test]
    fn annotations_count_only_for_trusted_servers() {
        let hinted = Tool {
            read_only: true,
            ..Tool::default()
        };
        let idem = Tool {
            idempotent: true,
            ..Tool::default()
        };
        let untrusted = Config::default();
        assert_eq!(untrusted.policy("x", Some(&hinted)).kind, ToolKind::Write);
        let trusted = Config::parse("trusted = true").unwrap();
        assert_eq!(trusted.policy("x", Some(&hinted)).kind, ToolKind::Read);
        assert_eq!(
            trusted.policy("x", Some(&idem)).kind,
            ToolKind::NaturalIdempotent
        );
        assert_eq!(trusted.policy("x", None).kind, ToolKind::Write);
        // A table is the whole policy: it beats the annotation.
        let table =
            Config::parse("trusted = true\n[tools.send]\nfallback_window = \"30s\"").unwrap();
        assert_eq!(table.policy("send", Some(&hinted)).kind, ToolKind::Write);
    }
}
