//! What the unit tests share: an engine's shared state over the memory store, as `Engine.open`
//! makes it for `memory:`, built without Python, and tickets of calls made on it.

use std::sync::Arc;
use std::time::Duration;

use idemgate::{AnyStore, Begun, Call, IdempotencyKey, TenantId, Ticket, ToolName, ToolPolicy};
use tokio::runtime::Handle;

use crate::shared::Shared;

/// An engine over a fresh memory store, on the current runtime.
pub(crate) async fn memory_engine() -> Arc<Shared> {
    let store = AnyStore::connect("memory:").await.unwrap();
    Arc::new(Shared {
        engine: Arc::new(idemgate::Engine::new(store)),
        tenant: TenantId::new("default").unwrap(),
        in_process_store: true,
        handle: Handle::current(),
        leases: Default::default(),
    })
}

/// The ticket of a first write call with `key`, its lease `lease` long.
pub(crate) async fn ticket(shared: &Shared, key: &str, lease: Duration) -> Ticket {
    let call = Call::new(shared.tenant.clone(), ToolName::new("send_email").unwrap())
        .key(IdempotencyKey::explicit(key).unwrap());
    let policy = ToolPolicy {
        lease,
        ..ToolPolicy::default()
    };
    match shared.engine.begin(call, &policy).await.unwrap() {
        Begun::Execute(ticket) => ticket,
        _ => panic!("the first call of a key runs"),
    }
}
