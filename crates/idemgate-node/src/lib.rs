//! The idemgate engine in-process for Node.js: the native addon of the `idemgate` npm package
//! (clients/node). One engine, not a port: the same policies, keys, fingerprints, answers,
//! journal and stores as every other front door, and the same stored-outcome format
//! (`idemgate_kit::Payload::Json`), so a record written from Node is replayed by the Python
//! package, `idemgate exec`/`serve`/`mcp` and vice versa.
//!
//! Nothing here blocks Node's thread: a method that touches the store first polls the engine's
//! future on Node's thread, marked as a thread that must not block, and returns the reply at once
//! when it needed no I/O (the memory store, a replay from the engine's cache); otherwise napi's
//! tokio runtime runs it on and a JavaScript promise resolves with the reply. A call is split in
//! two around the JavaScript function: `begin` reserves the key and, when the call may run, hands
//! back a ticket id while the lease keeper (`idemgate_kit::leases`, one task for every call)
//! renews the record's lease until `finish` reports what the function did.
//!
//! Answers cross as JSON text (see `reply`): the JavaScript side builds its `Result` or throws
//! the error class of the answer's verdict label, so every class is chosen by one table there.
//!
//! The modules: `engine` the `NativeEngine` handle and its methods; `reply` answers and errors
//! as JSON; `keys` the functions on keys and fingerprints.

mod engine;
mod keys;
mod reply;

pub use engine::{flush_traces, open_engine, tracing, CallInit, NativeEngine, PolicyInit};
pub use keys::{
    check_key, derive_key, fingerprint, invocation_scope, mint_key, name_action, verdict_labels,
    ActionFacts, ActionName,
};

/// The runtime the addon's store calls run on: one worker thread unless
/// `IDEMGATE_NODE_WORKER_THREADS` says more. One, because what runs there is waiting on a store,
/// not work: with one worker a store's connection and the calls waiting on it share a thread, so
/// a reply is not handed from one worker to another (fresh Redis calls measured about 1.2×
/// slower with napi's default of a worker per core: clients/node/README.md, "Beside the Node
/// peers"). Built at module load, before any call.
#[napi_derive::module_init]
fn init() {
    let workers = std::env::var("IDEMGATE_NODE_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1);
    if let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("idemgate-node")
        .enable_all()
        .build()
    {
        napi::bindgen_prelude::create_custom_tokio_runtime(rt);
    }
}
