//! End-to-end tests of the `idemgate` binary.

mod cli;
mod clock;
mod console_oidc;
mod faultproxy;
// Shared with idemgate-redis's cluster tests, which use all of it.
#[allow(dead_code)]
#[path = "../../idemgate-redis/tests/cluster_support.rs"]
mod cluster_support;
mod gateway;
mod mcp;
mod mcp_commerce;
mod mcp_http;
mod mcp_lint;
mod mcp_oauth;
mod mcp_real;
mod mcp_ts;
mod mcp_upstream;
mod regressions;
mod same_action;
mod scan;
mod sealed;

/// Tests that load both cores (process storms, crash tests) take this lock so that they run one
/// after the other: together they would starve each other of the time their deadlines assume.
fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}
