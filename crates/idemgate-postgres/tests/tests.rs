//! Integration tests of the Postgres store, against real servers on loopback: the shared one
//! (`IDEMGATE_TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`) and, for the
//! crash and replication tests, private instances started in temporary directories.

mod crash;
mod replication;
mod sealed;
mod store;
mod storm;
mod support;
