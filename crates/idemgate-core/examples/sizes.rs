//! Prints the sizes of the engine's futures and records (a tuning aid).
use idemgate_core::*;
fn main() {
    let engine = Engine::new(MemoryStore::new());
    let call = Call::new(TenantId::new("a").unwrap(), ToolName::new("b").unwrap());
    let p = ToolPolicy::default();
    let f = engine.call(call.clone(), || async { Effect::Success(vec![]) });
    println!("call future: {}", std::mem::size_of_val(&f));
    let g = engine.begin(call.clone(), &p);
    println!("begin future: {}", std::mem::size_of_val(&g));
    let s = MemoryStore::new();
    let r = Reservation::new(
        Key::new(
            TenantId::new("a").unwrap(),
            ToolName::new("b").unwrap(),
            IdempotencyKey::new("c").unwrap(),
        ),
        Fingerprint::of_bytes(b""),
        std::time::Duration::from_secs(1),
    );
    println!("reserve future: {}", std::mem::size_of_val(&s.reserve(&r)));
    println!(
        "wait_changed future: {}",
        std::mem::size_of_val(&s.wait_changed(
            &r.key,
            Default::default(),
            std::time::Duration::from_secs(1)
        ))
    );
    println!(
        "Answer: {}, Decision: {}, StoredRecord: {}, Record: {}",
        std::mem::size_of::<Answer>(),
        std::mem::size_of::<Decision>(),
        std::mem::size_of::<transition::StoredRecord>(),
        std::mem::size_of::<Record>()
    );
}
