//! What one session knows of the server's tools, and how it learns more: the [`Catalog`], the
//! parameters that modern requests mirror in headers ([`ParamHeaders`]), both learned from the
//! client's `tools/list` answers on their way and from listings of the proxy's own when a call
//! names a tool not seen yet. Apart from the catalog, which is what one listing says, because
//! this is the session's: its locks, its listings in flight.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::value::RawValue;

use super::catalog::{self, Catalog, Tool};
use crate::peer::{Peer, Reply};
use crate::sync::lock;
use crate::wire::frame::Object;
use crate::wire::mirror::ParamHeaders;

/// How long the proxy waits for an answer to its own `tools/list`.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// The most pages of its own `tools/list` the proxy reads.
const MAX_LIST_PAGES: usize = 100;

/// The server's tools as one session knows them.
pub(crate) struct Tools {
    catalog: Mutex<Catalog>,
    /// The tool parameters that requests of the 2026-07-28 era mirror in headers, learned from
    /// the same listings as the catalog; the HTTP transport checks sessionless requests by it.
    params: Arc<Mutex<ParamHeaders>>,
    /// One listing of the proxy's own at a time.
    listing: tokio::sync::Mutex<()>,
    /// Ids of the client's `tools/list` requests not answered yet.
    lists: Mutex<HashSet<String>>,
}

impl Tools {
    /// Nothing known yet.
    pub(crate) fn new() -> Self {
        Tools {
            catalog: Mutex::new(Catalog::new()),
            params: Arc::default(),
            listing: tokio::sync::Mutex::new(()),
            lists: Mutex::new(HashSet::new()),
        }
    }

    /// The tool parameters mirrored in headers, as far as they are known (see `Tools::params`).
    pub(crate) fn param_headers(&self) -> Arc<Mutex<ParamHeaders>> {
        Arc::clone(&self.params)
    }

    /// The server said its tools changed (`notifications/tools/list_changed`).
    pub(crate) fn changed(&self) {
        lock(&self.catalog).changed();
    }

    /// The client sent the `tools/list` request `id`: its answer is learned on its way.
    pub(crate) fn listed_by_client(&self, id: String) {
        lock(&self.lists).insert(id);
    }

    /// The server answered the request `id` with `result`: learned when the request is one of
    /// the client's `tools/list`; whether it was.
    pub(crate) fn answered(&self, id: &str, result: Option<&RawValue>) -> bool {
        if !lock(&self.lists).remove(id) {
            return false;
        }
        if let Some(result) = result {
            self.learn(result);
        }
        true
    }

    /// The client's `tools/list` result `page`, learned already, as the client sees it: every
    /// write the proxy gates (as `policy` says, given what the server said of the tool) takes
    /// the model's `idempotency_key` ([`catalog::offer_key_argument`]).
    pub(crate) fn shown(
        &self,
        page: &RawValue,
        gated: impl Fn(&str, Option<&Tool>) -> bool,
    ) -> Option<Box<RawValue>> {
        let catalog = lock(&self.catalog);
        catalog::offer_key_argument(page, |name| gated(name, catalog.get(name)))
    }

    /// Learns a `tools/list` result (one page) into the catalog and the mirrored parameters;
    /// the next page's cursor.
    fn learn(&self, result: &RawValue) -> Option<String> {
        if let Ok(value) = serde_json::from_str(result.get()) {
            lock(&self.params).learn(&value);
        }
        lock(&self.catalog).learn(result)
    }

    /// What the server said about `name`, listing its tools first (through `peer`) if it has
    /// not been seen (a client that starts a proxy per call may call a tool without listing
    /// them), under the call's 2026-07-28 `envelope` when it has one.
    pub(crate) async fn describe(
        &self,
        peer: &Peer,
        name: &str,
        envelope: Option<Object>,
    ) -> Option<Tool> {
        // Known, or known to be absent from a whole listing: no need to ask.
        let known = |c: &Catalog| match c.get(name) {
            Some(t) => Some(Some(t.clone())),
            None => c.is_complete().then_some(None),
        };
        if let Some(t) = known(&lock(&self.catalog)) {
            return t;
        }
        let _one = self.listing.lock().await;
        if let Some(t) = known(&lock(&self.catalog)) {
            return t;
        }
        self.list_tools(peer, envelope).await;
        lock(&self.catalog).get(name).cloned()
    }

    /// Lists the server's tools with requests of the proxy's own (ids the client never uses),
    /// carrying `envelope` as their `_meta` when given.
    async fn list_tools(&self, peer: &Peer, envelope: Option<Object>) {
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut params = match &cursor {
                Some(c) => serde_json::json!({ "cursor": c }),
                None => serde_json::json!({}),
            };
            if let Some(e) = &envelope {
                params["_meta"] = serde_json::to_value(e).expect("raw JSON is JSON");
            }
            let Some(Reply::Answer {
                result: Some(result),
                ..
            }) = peer.ask("tools/list", params, LIST_TIMEOUT).await
            else {
                return;
            };
            cursor = self.learn(&result);
            if cursor.is_none() {
                return;
            }
        }
    }
}
