#![doc = include_str!("../README.md")]

mod carried;
mod engine;
mod keys;
mod reply;

pub use carried::{CarriedRead, CarriedTarget};
pub use engine::{flush_traces, open_engine, tracing, NativeEngine};
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
