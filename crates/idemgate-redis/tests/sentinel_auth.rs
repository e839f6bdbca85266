//! Sentinels that require credentials (`requirepass` in the sentinel's own configuration): the
//! store reaches them with `sentinel_password` (and `sentinel_username`) from the URL, and the
//! primary with the URL's own user and password. On loopback, one primary and one sentinel; the
//! failover itself is `tests/sentinel.rs`'s.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idemgate_core::{Call, Decision, Effect, Engine, StoreError};
use idemgate_redis::RedisStore;

use crate::common::{free_port, random_hex, PrivateRedis};

const SERVICE: &str = "idemgate-auth";
const SENTINEL_PASSWORD: &str = "s3nt!nel@pw";

/// A private sentinel on a loopback port that requires [`SENTINEL_PASSWORD`], monitoring
/// `primary`; killed by its recorded pid when dropped.
struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(primary: &PrivateRedis) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().to_str().expect("utf-8 temp dir").to_owned();
        let port = free_port();
        let conf = format!("{path}/sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {path}\n\
                 logfile {path}/sentinel.log\nrequirepass \"{SENTINEL_PASSWORD}\"\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {} 1\n",
                primary.port()
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .args([conf.as_str(), "--sentinel"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start redis-server --sentinel ({e})"));
        let me = Sentinel {
            child,
            port,
            _dir: dir,
        };
        // Serving once it names the primary to a client that authenticates.
        let url = format!("redis://:{}@127.0.0.1:{port}", "s3nt!nel%40pw");
        let client = redis::Client::open(url).expect("sentinel url");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let named = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut c| {
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg(SERVICE)
                        .query::<Vec<String>>(&mut c)
                });
            match named {
                Ok(addr) if addr.len() == 2 => return me,
                other => assert!(
                    Instant::now() < deadline,
                    "the sentinel on port {port} did not name the primary: {other:?}"
                ),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn url(sentinel: &Sentinel, query: &str) -> String {
    format!(
        "redis+sentinel://127.0.0.1:{}/{SERVICE}?allow_volatile=true&key_prefix=idemgate-test-{}:{query}",
        sentinel.port,
        random_hex(6)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_that_require_a_password_are_reached_with_sentinel_password() {
    let primary = PrivateRedis::start(false);
    let sentinel = Sentinel::start(&primary);

    // The password percent-encoded in the query ('@' is %40).
    let store = RedisStore::connect(&url(&sentinel, "&sentinel_password=s3nt!nel%40pw"))
        .await
        .expect("connect through a sentinel that requires a password");
    let engine = Engine::new(store);
    let call =
        || Call::new("tenant".parse().unwrap(), "tool".parse().unwrap()).key("k".parse().unwrap());
    let first = engine
        .call(call(), || async { Effect::Success(b"done".to_vec()) })
        .await
        .expect("first call");
    assert!(
        matches!(first.decision, Decision::Executed { .. }),
        "{first:?}"
    );
    let again = engine
        .call(call(), || async { Effect::Success(b"twice".to_vec()) })
        .await
        .expect("replay");
    assert!(
        matches!(again.decision, Decision::Replayed { .. }),
        "{again:?}"
    );

    // Without it, or with a wrong one, the store refuses to start and says why, without the
    // password.
    for query in ["", "&sentinel_password=wrong-secret"] {
        let e = RedisStore::connect(&url(&sentinel, query))
            .await
            .err()
            .unwrap_or_else(|| panic!("connected through the sentinel with {query:?}"));
        let text = e.to_string();
        assert!(
            matches!(e, StoreError::Unavailable(_)) && text.to_lowercase().contains("auth"),
            "{query:?}: {e:?}"
        );
        assert!(!text.contains("wrong-secret"), "{text}");
    }
}
