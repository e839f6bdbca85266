//! The store's settings: [`PgOptions`] in Rust, and the options a `postgres:` URL may set.

use std::time::Duration;

use idemgate_core::url::UrlQuery;
use idemgate_core::{ReservePath, StoreError};

use crate::Result;

/// What to do with a server whose `synchronous_commit` would let an acknowledged write be lost in
/// a crash (`off`, or `local` while synchronous standbys are configured).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncCommit {
    /// Set `synchronous_commit = on` in every session the pool opens (post-create hook). The
    /// default: a completion the store acknowledged is on disk.
    #[default]
    Enforce,
    /// Refuse to connect ([`StoreError::Misconfigured`]).
    Refuse,
    /// Leave the setting as it is: the operator accepts that a crash may lose acknowledged records
    /// (duplicates could then run again).
    AllowLoss,
}

/// Settings of a [`PgStore`](crate::PgStore).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgOptions {
    /// Most connections the pool opens (the listener connection comes on top).
    pub pool_size: usize,
    /// Server-side `statement_timeout` of every session; the client waits this long plus
    /// [`PgOptions::answer_margin`] for an answer before it reports the write as indeterminate.
    pub statement_timeout: Duration,
    /// How long the client waits beyond `statement_timeout` (network, commit flush).
    pub answer_margin: Duration,
    /// How long to wait for a connection (TCP connect, session setup, a free pool slot).
    pub connect_timeout: Duration,
    /// The schema that holds the tables (created if missing).
    pub schema: String,
    /// What to do about `synchronous_commit`.
    pub synchronous_commit: SyncCommit,
    /// Whether waiting duplicates are woken by `LISTEN`/`NOTIFY` (else they poll).
    pub listen: bool,
    /// How a reservation reaches its row (only the cost differs; see [`ReservePath`]).
    pub reserve_path: ReservePath,
    /// Accept a primary that streams to asynchronous standbys (`sync_state = 'async'` in
    /// `pg_stat_replication`: standbys a commit does not wait for). A failover to one loses the
    /// outcomes the store acknowledged but the standby had not received yet, so those calls run
    /// again when re-sent. By default such a primary is refused at connect. Also set by
    /// `?allow_async_replication=true` in the URL (the URL wins).
    pub allow_async_replication: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            pool_size: 16,
            statement_timeout: Duration::from_secs(5),
            answer_margin: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            schema: "public".to_owned(),
            synchronous_commit: SyncCommit::Enforce,
            listen: true,
            reserve_path: ReservePath::Adaptive,
            allow_async_replication: false,
        }
    }
}

/// The query options of a Postgres URL that the store reads itself, and takes out of the URL
/// before tokio-postgres reads it.
pub(crate) const OWN_OPTIONS: &[&str] = &["allow_async_replication"];

/// The query options of a Postgres URL that tokio-postgres reads, under libpq's names. Options
/// of libpq that tokio-postgres does not know (`sslrootcert`, `gssencmode`, …) are refused.
pub(crate) const URL_OPTIONS: &[&str] = &[
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// TCP keepalives that find a pooled connection a firewall or load balancer dropped without a
/// word within about a minute of idleness (30 s, then 3 probes 10 s apart), rather than the
/// system's two hours: the pool then sees it closed and opens another, where a statement sent
/// on it would have waited out its timeout and ended indeterminate. Options the URL sets itself
/// (`keepalives`, `keepalives_idle`, `keepalives_interval`, `keepalives_retries`) are kept.
pub(crate) fn probe_idle_connections(config: &mut tokio_postgres::Config, query: &UrlQuery<'_>) {
    let set = |name: &str| query.options.iter().any(|(n, _)| *n == name);
    if !set("keepalives_idle") {
        config.keepalives_idle(Duration::from_secs(30));
    }
    if !set("keepalives_interval") {
        config.keepalives_interval(Duration::from_secs(10));
    }
    if !set("keepalives_retries") {
        config.keepalives_retries(3);
    }
}

/// Reads the store's own options ([`OWN_OPTIONS`]) from the URL's query into `options` (the URL
/// wins), and returns the URL without them for tokio-postgres: every other option stays exactly
/// as written (its percent-encoding too), and a URL without the store's options is returned as
/// it came.
pub(crate) fn own_options<'a>(
    url: &'a str,
    query: &UrlQuery<'a>,
    mut options: PgOptions,
) -> Result<(std::borrow::Cow<'a, str>, PgOptions)> {
    let own = |name: &str| OWN_OPTIONS.contains(&name);
    for (_, value) in query
        .options
        .iter()
        .filter(|(name, _)| *name == "allow_async_replication")
    {
        options.allow_async_replication = match *value {
            "" | "true" | "1" | "yes" => true,
            "false" | "0" | "no" => false,
            _ => {
                return Err(StoreError::misconfigured(format!(
                    "failed to read allow_async_replication={value:?} in the postgres URL: \
                     expected true or false"
                )))
            }
        };
    }
    if !query.options.iter().any(|(name, _)| own(name)) {
        return Ok((std::borrow::Cow::Borrowed(url), options));
    }
    // The raw pairs after the `?`, as UrlQuery split them, less the store's own.
    let raw = &url[query.base.len() + 1..];
    let rest: Vec<&str> = raw
        .split('&')
        .filter(|pair| !own(pair.split_once('=').map_or(*pair, |(name, _)| name)))
        .collect();
    let url = if rest.iter().all(|pair| pair.is_empty()) {
        query.base.to_owned()
    } else {
        format!("{}?{}", query.base, rest.join("&"))
    };
    Ok((std::borrow::Cow::Owned(url), options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::async_replication_refused;

    fn configured(url: &str) -> tokio_postgres::Config {
        let query = UrlQuery::parse(url, "postgres", URL_OPTIONS).unwrap();
        let mut config: tokio_postgres::Config = url.parse().unwrap();
        probe_idle_connections(&mut config, &query);
        config
    }

    /// The URL tokio-postgres gets and the option read, for `url` and a default of `allow`.
    fn own(url: &str, allow: bool) -> Result<(String, bool)> {
        let known = [OWN_OPTIONS, URL_OPTIONS].concat();
        let query = UrlQuery::parse(url, "postgres", &known)?;
        let options = PgOptions {
            allow_async_replication: allow,
            ..PgOptions::default()
        };
        let (url, options) = own_options(url, &query, options)?;
        Ok((url.into_owned(), options.allow_async_replication))
    }

    #[test]
    fn allow_async_replication_is_read_and_taken_out_of_the_url() {
        let base = "postgres://u:p%40ss@h:5/db";
        // No option of the store's: the URL as it came, the default kept.
        for allow in [false, true] {
            assert_eq!(own(base, allow).unwrap(), (base.to_owned(), allow));
            let url = format!("{base}?options=-c%20a%3Db&application_name=x%26y");
            assert_eq!(own(&url, allow).unwrap(), (url.clone(), allow));
        }
        for (value, on) in [
            ("", true),
            ("=", true),
            ("=true", true),
            ("=1", true),
            ("=yes", true),
            ("=false", false),
            ("=0", false),
            ("=no", false),
        ] {
            // The URL wins over the options struct, both ways.
            let url = format!("{base}?allow_async_replication{value}");
            assert_eq!(own(&url, !on).unwrap(), (base.to_owned(), on), "{url}");
        }
        // The other options stay as written, percent-encoding and order included.
        let url = format!(
            "{base}?options=-c%20synchronous_commit%3Don&allow_async_replication=true\
             &application_name=a%20b&allow_async_replication=0&sslmode=disable"
        );
        let rest = format!(
            "{base}?options=-c%20synchronous_commit%3Don&application_name=a%20b&sslmode=disable"
        );
        // The last one counts.
        assert_eq!(own(&url, false).unwrap(), (rest.clone(), false));
        // What remains is what tokio-postgres reads.
        let config: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(config.get_application_name(), Some("a b"));
        assert_eq!(config.get_password(), Some(&b"p@ss"[..]));
        for bad in ["maybe", "TRUE", "on"] {
            let url = format!("{base}?allow_async_replication={bad}");
            match own(&url, false) {
                Err(StoreError::Misconfigured(m)) => {
                    assert!(m.contains("allow_async_replication="), "{m}");
                    assert!(!m.contains("p%40ss"), "{m}");
                }
                other => panic!("{bad}: expected Misconfigured, got {other:?}"),
            }
        }
        // Misspelt: refused by name, the store's option listed among the valid ones.
        match own(&format!("{base}?allow_async=1"), false) {
            Err(StoreError::Misconfigured(m)) => {
                assert!(m.contains("\"allow_async\""), "{m}");
                assert!(m.contains("allow_async_replication, user"), "{m}");
            }
            other => panic!("expected Misconfigured, got {other:?}"),
        }
    }

    #[test]
    fn the_refusal_names_the_standbys_the_loss_and_the_ways_out() {
        let StoreError::Misconfigured(m) = async_replication_refused(&["walreceiver".to_owned()])
        else {
            panic!("expected Misconfigured")
        };
        for part in [
            "1 asynchronous standby (application_name [\"walreceiver\"])",
            "a failover to it loses the outcomes the store acknowledged",
            "calls that ran would run again",
            "synchronous_standby_names",
            "allow_async_replication=true",
        ] {
            assert!(m.contains(part), "{part}: {m}");
        }
        let m = async_replication_refused(&["a".to_owned(), "b".to_owned()]).to_string();
        assert!(m.contains("2 asynchronous standbys"), "{m}");
    }

    #[test]
    fn idle_connections_are_probed_within_a_minute_unless_the_url_says_otherwise() {
        let c = configured("postgres://u@h/db");
        assert!(c.get_keepalives());
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(c.get_keepalives_interval(), Some(Duration::from_secs(10)));
        assert_eq!(c.get_keepalives_retries(), Some(3));
        let c = configured("postgres://u@h/db?keepalives_idle=600&keepalives_retries=9");
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(600));
        assert_eq!(c.get_keepalives_interval(), Some(Duration::from_secs(10)));
        assert_eq!(c.get_keepalives_retries(), Some(9));
        assert!(!configured("postgres://u@h/db?keepalives=0").get_keepalives());
    }
}
