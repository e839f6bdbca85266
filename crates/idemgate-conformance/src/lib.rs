#![doc = include_str!("../README.md")]

mod behaviours;
mod fixture;
pub mod model;
pub mod servers;
pub mod tmpfs;

#[doc(hidden)]
pub use idemgate_core::caller::waiting as waiting_caller;
#[doc(hidden)]
pub use proptest;
#[doc(hidden)]
pub use tokio;

// The behaviours and the fixture live in modules of their own (the behaviours by what they
// exercise); the crate's face stays flat, as `store_conformance!` and the stores' tests name them.
pub use behaviours::expiry::*;
pub use behaviours::history::*;
pub use behaviours::leases::*;
pub use behaviours::listing::*;
pub use fixture::{
    fresh_key, Fixture, ListedAs, Teardown, TimeTravel, LONG_LEASE, LONG_TTL, PAST_SHORT_LEASE,
    SHORT_LEASE,
};

/// Stamps out every behaviour as a named `#[tokio::test]` for one store.
///
/// `$setup` is an expression evaluating to a future of a [`Fixture`] (whose store is `Clone`):
///
/// ```ignore
/// idemgate_conformance::store_conformance!(async {
///     idemgate_conformance::Fixture::manual(|clock| idemgate_core::MemoryStore::with_clock(clock))
/// });
/// ```
///
/// `store_conformance!(waiting: $setup)` runs each behaviour with its own thread marked as a
/// waiting caller (`idemgate_core::caller::waiting`), as the Python door polls a call: a store
/// that does a waiting caller's I/O on its own connection is held to the same answers there,
/// beside the tasks the behaviours spawn, which keep the store's shared connection.
#[macro_export]
macro_rules! store_conformance {
    (waiting: $setup:expr) => {
        $crate::store_conformance!(@all each_waiting $setup);
    };
    ($setup:expr) => {
        $crate::store_conformance!(@all each $setup);
    };
    // Every behaviour, named once, for either arm.
    (@all $arm:ident $setup:expr) => {
        $crate::store_conformance!(@$arm $setup;
            race_32_way_one_acquires,
            reserve_retry_with_same_token_acquires,
            completed_record_replays,
            failed_outcome_is_stored,
            fingerprint_mismatch_is_visible,
            expired_lease_becomes_unknown_and_can_be_taken_over,
            stale_fence_is_rejected,
            released_lease_cannot_complete_new_record,
            late_completion_by_current_holder_is_kept,
            complete_is_idempotent_for_its_lease,
            late_completion_keeps_its_execution_time,
            release_removes_the_record,
            completed_record_cannot_be_released,
            mark_unknown_blocks_the_key,
            heartbeat_extends_the_lease,
            expired_record_counts_as_absent,
            purge_removes_only_expired,
            list_filters_by_tenant_tool_and_state,
            tenants_are_isolated,
            dropped_reservations_leave_consistent_state,
            reopen_expires_a_completed_record_at_its_fence,
            reopen_leaves_other_records_alone,
            records_keep_their_scope_and_list_by_it,
            tombstone_answers_after_the_ttl_until_it_goes,
            reopen_clears_a_tombstone,
            pages_list_every_record_once,
            history_follows_the_record_until_it_goes,
            purge_takes_a_records_history_with_it,
        );
    };
    (@each_waiting $setup:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let runtime = $crate::tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .expect("a runtime");
                $crate::waiting_caller(|| {
                    runtime.block_on(async {
                        let fx = $setup.await;
                        $crate::$name(&fx).await;
                    })
                });
            }
        )*
    };
    (@each $setup:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let fx = $setup.await;
                $crate::$name(&fx).await;
            }
        )*
    };
}
