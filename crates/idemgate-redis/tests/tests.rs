//! Integration tests against real Redis servers on loopback: the shared one at
//! `IDEMGATE_TEST_REDIS_URL` (default `redis://127.0.0.1:6379`, used under a random key prefix and
//! never flushed or reconfigured) and private `redis-server` processes started per test.

mod common;
mod crash;
mod direct;
mod keys;
mod noscript;
mod persistence;
mod replicas;
mod sealed;
mod sentinel_auth;
mod storm;
mod tombstone;
mod url;
mod wake;
