//! Task requests across the eras: a modern client's `tasks/get` and `tasks/cancel` (the 2026
//! tasks extension) before a legacy server, and a legacy client's `tasks/get`, `tasks/result`,
//! `tasks/cancel` and `tasks/list` (2025-11-25) before a modern server of the extension. The
//! proxy answers each from requests of its own in the server's words. Apart from the routing in
//! [`super`] because each is a conversation with the server that runs in a task of its own.

use std::time::Duration;

use serde_json::value::RawValue;

use crate::peer::{Peer, Reply};
use crate::wire::era;
use crate::wire::frame::{self, Object};

/// How long the proxy waits for a legacy server's answer to the task requests it sends on a
/// modern client's behalf (`tasks/get`, `tasks/result` of a finished task, `tasks/cancel`).
const TASK_TIMEOUT: Duration = Duration::from_secs(30);

/// A client's task request that the proxy answers in the other era's words.
pub(crate) enum TaskRequest {
    /// A modern client's, to a legacy server ([`modern`]).
    Modern {
        id: Box<RawValue>,
        method: String,
        params: Option<Box<RawValue>>,
    },
    /// A legacy client's, to a modern server whose requests carry `envelope` ([`legacy`]).
    Legacy {
        id: Box<RawValue>,
        method: String,
        params: Option<Box<RawValue>>,
        envelope: Object,
    },
}

impl TaskRequest {
    /// A modern client's request `method`.
    pub(crate) fn modern(id: &RawValue, method: &str, params: Option<Box<RawValue>>) -> Self {
        TaskRequest::Modern {
            id: id.to_owned(),
            method: method.to_owned(),
            params,
        }
    }

    /// A legacy client's request `method`, to go under `envelope`.
    pub(crate) fn legacy(
        id: &RawValue,
        method: &str,
        params: Option<Box<RawValue>>,
        envelope: Object,
    ) -> Self {
        TaskRequest::Legacy {
            id: id.to_owned(),
            method: method.to_owned(),
            params,
            envelope,
        }
    }

    /// The answer for the client, from the server's answers to the proxy's own requests.
    pub(crate) async fn answer(self, peer: &Peer) -> String {
        match self {
            TaskRequest::Modern { id, method, params } => {
                modern(peer, &id, &method, params.as_deref()).await
            }
            TaskRequest::Legacy {
                id,
                method,
                params,
                envelope,
            } => legacy(peer, &id, &method, params.as_deref(), envelope).await,
        }
    }
}

/// A modern client's `tasks/get` or `tasks/cancel` before a legacy server, answered in the
/// tasks extension's words from the server's own `tasks/get`, `tasks/result` and
/// `tasks/cancel`: a finished task carries its `result` (or `error`) inline, and a tool
/// result with `isError` is a `completed` task (2025-11-25 called it `failed`); a cancel is
/// acknowledged whatever became of the task.
async fn modern(peer: &Peer, id: &RawValue, method: &str, params: Option<&RawValue>) -> String {
    let params = params.and_then(frame::object).unwrap_or_default();
    let Some(task_id) = params.get("taskId").cloned() else {
        return frame::error_response(Some(id), -32602, "Invalid params: taskId is required");
    };
    let ask = |method: &'static str| {
        peer.ask(
            method,
            serde_json::json!({ "taskId": &task_id }),
            TASK_TIMEOUT,
        )
    };
    if method == "tasks/cancel" {
        let _ = ask("tasks/cancel").await;
        return frame::response(
            id,
            &frame::raw(&serde_json::json!({"resultType": "complete"})),
        );
    }
    let task = match task_of(id, ask("tasks/get").await) {
        Ok(task) => task,
        Err(answer) => return answer,
    };
    let finished = matches!(
        frame::string(&task, "status").as_deref(),
        Some("completed" | "failed")
    );
    let mut answer = era::modern_task(task);
    if finished {
        match ask("tasks/result").await {
            Some(Reply::Answer {
                result: Some(r), ..
            }) => {
                answer.insert("status".to_owned(), frame::raw(&"completed"));
                answer.insert("result".to_owned(), r);
            }
            Some(Reply::Answer { error: Some(e), .. }) => {
                answer.insert("status".to_owned(), frame::raw(&"failed"));
                answer.insert("error".to_owned(), e);
            }
            _ => {}
        }
    }
    answer.insert("resultType".to_owned(), frame::raw(&"complete"));
    frame::response(id, &frame::raw(&answer))
}

/// A legacy client's `tasks/get`, `tasks/result`, `tasks/cancel` or `tasks/list` before a
/// modern server of the tasks extension (whose requests carry `envelope`), in 2025-11-25
/// words ([`era::legacy_task`]): `tasks/result`, which the extension has not, polls the
/// server's `tasks/get` at its `pollIntervalMs` until the task ends and answers with its
/// result (marked with the related task, as that era does) or its error; `tasks/cancel`
/// asks the server to cancel and answers with the task, `cancelled` unless it had ended;
/// `tasks/list`, which the extension has not either, is refused (`-32601`; the proxy
/// declares no `tasks.list` capability).
async fn legacy(
    peer: &Peer,
    id: &RawValue,
    method: &str,
    params: Option<&RawValue>,
    envelope: Object,
) -> String {
    if method == "tasks/list" {
        return frame::error_response(
            Some(id),
            -32601,
            "tasks/list: the server speaks the 2026 tasks extension, which lists no tasks",
        );
    }
    let params = params.and_then(frame::object).unwrap_or_default();
    let Some(task_id) = params.get("taskId").cloned() else {
        return frame::error_response(Some(id), -32602, "Invalid params: taskId is required");
    };
    let ask = |method: &'static str| {
        let params = serde_json::json!({ "taskId": &task_id, "_meta": &envelope });
        peer.ask(method, params, TASK_TIMEOUT)
    };
    if method == "tasks/cancel" {
        let _ = ask("tasks/cancel").await;
    }
    loop {
        let task = match task_of(id, ask("tasks/get").await) {
            Ok(task) => task,
            Err(answer) => return answer,
        };
        let status = frame::string(&task, "status").unwrap_or_default();
        let ended = ["completed", "failed", "cancelled"].contains(&status.as_str());
        match method {
            "tasks/get" => return frame::response(id, &frame::raw(&era::legacy_task(&task))),
            "tasks/cancel" => {
                let mut answer = era::legacy_task(&task);
                if !ended {
                    answer.insert("status".to_owned(), frame::raw(&"cancelled"));
                }
                return frame::response(id, &frame::raw(&answer));
            }
            _ => {}
        }
        if ended {
            return ended_task(id, &task_id, &status, &task);
        }
        let poll = task
            .get("pollIntervalMs")
            .and_then(|p| serde_json::from_str::<u64>(p.get()).ok())
            .unwrap_or(1000);
        tokio::time::sleep(Duration::from_millis(poll.clamp(10, 5000))).await;
    }
}

/// The answer to a legacy client's `tasks/result` (request `id`) for the task `task_id`, which
/// ended with `status` as `task` says: its result, marked with the related task as the legacy
/// era does, or its error, or why it has neither.
fn ended_task(id: &RawValue, task_id: &RawValue, status: &str, task: &Object) -> String {
    match (status, task.get("result"), task.get("error")) {
        ("completed", Some(result), _) => {
            let mut result = frame::object(result).unwrap_or_default();
            let mut meta = result
                .get("_meta")
                .and_then(|m| frame::object(m))
                .unwrap_or_default();
            meta.insert(
                "io.modelcontextprotocol/related-task".to_owned(),
                frame::raw(&serde_json::json!({ "taskId": task_id })),
            );
            result.insert("_meta".to_owned(), frame::raw(&meta));
            frame::response(id, &frame::raw(&result))
        }
        (_, _, Some(error)) => format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
            id.get(),
            error.get()
        ),
        _ => frame::error_response(
            Some(id),
            -32602,
            &format!("the task ended {status} without a result"),
        ),
    }
}

/// The task a server's answer to `tasks/get` holds, or the answer to the client's request `id`
/// when it holds none: the server's error, or why no answer came.
fn task_of(id: &RawValue, reply: Option<Reply>) -> Result<Object, String> {
    match reply {
        Some(Reply::Answer {
            result: Some(r), ..
        }) => Ok(frame::object(&r).unwrap_or_default()),
        Some(Reply::Answer { error: Some(e), .. }) => Err(format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
            id.get(),
            e.get()
        )),
        _ => Err(frame::error_response(
            Some(id),
            -32603,
            "the server did not answer tasks/get",
        )),
    }
}
