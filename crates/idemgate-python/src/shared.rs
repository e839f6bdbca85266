//! What an engine's tasks share: the engine over its store, the tenant, the runtime's handle and
//! the leases being kept. A leaf of its own so that the pieces of a call (call.rs), the runtime's
//! bridge (runtime.rs) and the Python class (engine.rs) all read it and none of them has to
//! import another to get it: the imports run one way, from engine.rs down.

use std::sync::Arc;

use idemgate::{AnyStore, TenantId};
use idemgate_kit::leases::Leases;
use tokio::runtime::Handle;

/// What the engine's tasks share.
pub(crate) struct Shared {
    pub(crate) engine: Arc<idemgate::Engine<AnyStore>>,
    pub(crate) tenant: TenantId,
    /// The store keeps its records in this process (`memory:`): its futures finish without I/O,
    /// so a call is first polled on the caller's thread with the GIL held (see
    /// `OnRuntime::run`).
    pub(crate) in_process_store: bool,
    pub(crate) handle: Handle,
    pub(crate) leases: Arc<Leases>,
}
