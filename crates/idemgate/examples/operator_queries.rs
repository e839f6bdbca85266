//! The operator's frequent queries timed in-process on a store named by URL, without the
//! command's process start and store opening around them: a page of unknown records (what
//! `idemgate keys list --state unknown` asks), their count (what the gateway's list answer
//! adds), and a purge (`idemgate keys purge --expired`). Run by `scripts/bench-operator-queries`,
//! which fills the store first.
//!
//! Usage: `cargo run --release -p idemgate --example operator_queries -- URL [ROUNDS]`

use std::future::Future;
use std::time::Instant;

use idemgate::{AnyStore, ListFilter, State, Store as _};

/// Runs `op` once unmeasured, then `rounds` times, and prints the median, min and max.
async fn time<T, F: Future<Output = T>>(what: &str, rounds: usize, mut op: impl FnMut() -> F) {
    op().await;
    let mut ms = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        op().await;
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "  {what:<52} median {:7.2} ms   min {:7.2}   max {:7.2}",
        ms[ms.len() / 2],
        ms[0],
        ms[ms.len() - 1]
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: operator_queries URL [ROUNDS]");
    let rounds = args
        .next()
        .map_or(11, |r| r.parse().expect("ROUNDS is a number"));
    let store = AnyStore::connect(&url).await.expect("open the store");
    // As `keys list --state unknown` asks: a page of 100, and one more to know if another follows.
    let unknown = ListFilter {
        state: Some(State::Unknown),
        limit: 101,
        ..ListFilter::default()
    };
    time("in process: a page of unknown records", rounds, || async {
        store.list(&unknown).await.expect("list")
    })
    .await;
    time(
        "in process: count unknown records (up to 10,000)",
        rounds,
        || async { store.count(&unknown, 10_000).await.expect("count") },
    )
    .await;
    time(
        "in process: purge_expired (nothing due)",
        rounds,
        || async {
            assert_eq!(
                store.purge_expired().await.expect("purge"),
                0,
                "the purge found records due"
            );
        },
    )
    .await;
}
