//! The store's settings: [`RedisOptions`] in Rust, and the options a `redis:` URL may set (also
//! for Redis Cluster and Sentinel).

use std::time::Duration;

use idemgate_core::store::Result;
use idemgate_core::url::UrlQuery;
use idemgate_core::{ReservePath, StoreError};
use redis::sentinel::SentinelNodeConnectionInfo;
use redis::{ConnectionInfo, RedisConnectionInfo};

use crate::MAX_MS;

/// Settings of a [`RedisStore`](crate::RedisStore).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    /// Accept a Redis without append-only persistence, with `appendfsync no`, or whose settings
    /// cannot be read: records, in-flight reservations included, are lost when it (or its
    /// machine) restarts, so a side effect may run twice.
    /// Also set by `?allow_volatile=true` in the URL.
    pub allow_volatile: bool,
    /// After every write, wait until this many replicas acknowledged it (`WAIT n timeout`); fewer
    /// acknowledgements make the write [`StoreError::Indeterminate`], since a failover could lose it.
    /// Also set by `?wait_replicas=N&wait_timeout=500ms` in the URL.
    pub wait_replicas: Option<(u32, Duration)>,
    /// The prefix of every key name: letters, digits, `:`, `_`, `.` and `-`, at most 64 bytes. Also
    /// set by `?key_prefix=...` in the URL.
    pub key_prefix: String,
    /// How long a command may take before its answer counts as lost (then the write is
    /// [`StoreError::Indeterminate`]). `None`: wait forever.
    pub response_timeout: Option<Duration>,
    /// How long one connection attempt may take.
    pub connection_timeout: Option<Duration>,
    /// How long after it stops counting (the end of its tombstone, or its expiry when it keeps
    /// none) a completed record stays in Redis before Redis reaps it. Within the grace the record
    /// already counts as absent, but it still carries its fence (so the next reservation
    /// continues the count) and still answers a late retry of its completion.
    pub expiry_grace: Duration,
    /// How a reservation reaches its record (only the cost differs; see [`ReservePath`]): the
    /// reserve script, or first a plain `HGETALL`, which runs no script, so that a duplicate is
    /// one plain read. With `wait_replicas` every reservation runs the script (and its `WAIT`).
    pub reserve_path: ReservePath,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            allow_volatile: false,
            wait_replicas: None,
            key_prefix: "idemgate:".to_owned(),
            response_timeout: Some(Duration::from_secs(5)),
            connection_timeout: Some(Duration::from_secs(2)),
            expiry_grace: Duration::from_secs(60),
            reserve_path: ReservePath::Adaptive,
        }
    }
}

pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.' | b'-');
    if prefix.len() > 64 || !prefix.bytes().all(ok) {
        return Err(StoreError::misconfigured(format!(
            "redis key prefix {prefix:?} is not allowed: use at most 64 letters, digits, ':', '_', \
             '.' and '-' (no glob or hash-tag characters)"
        )));
    }
    Ok(())
}

/// The query options this crate reads itself.
const OWN_OPTIONS: &[&str] = &["allow_volatile", "key_prefix"];
/// The query options of replicated mode ([`RedisOptions::wait_replicas`]), also read by this crate.
const WAIT_OPTIONS: &[&str] = &["wait_replicas", "wait_timeout"];
/// How long a write waits for its replicas when the URL names `wait_replicas` but no
/// `wait_timeout`.
const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);
/// The query options of a `redis+sentinel://` URL for the sentinels themselves (Sentinel's own
/// `requirepass`, or an ACL user of the sentinels), read by [`sentinel_parts`]; the URL's user and
/// password are the primary's.
const SENTINEL_OPTIONS: &[&str] = &["sentinel_username", "sentinel_password"];
/// The query options redis-rs reads from every URL.
const DRIVER_OPTIONS: &[&str] = &["protocol"];
/// The query options redis-rs reads only from Unix-socket URLs (a TCP URL carries them in its
/// user, password and path, and redis-rs ignores them in its query).
const UNIX_DRIVER_OPTIONS: &[&str] = &["db", "user", "pass"];

/// Takes this crate's settings out of the URL's query; the driver's options go on to redis-rs, and
/// any other is refused, so that a misspelt option cannot silently fall back to a default.
pub(crate) fn parse_url(url: &str, mut options: RedisOptions) -> Result<(String, RedisOptions)> {
    let unix = ["unix:", "redis+unix:", "valkey+unix:"]
        .iter()
        .any(|scheme| url.starts_with(scheme));
    let mut known = [OWN_OPTIONS, DRIVER_OPTIONS, WAIT_OPTIONS].concat();
    if unix {
        known.extend_from_slice(UNIX_DRIVER_OPTIONS);
    }
    if url.starts_with("redis+sentinel://") {
        known.extend_from_slice(SENTINEL_OPTIONS);
    }
    let query = UrlQuery::parse(url, "redis", &known)?;
    let mut rest = Vec::new();
    let (mut replicas, mut timeout) = (None, None);
    for (name, value) in query.options {
        match name {
            "allow_volatile" => {
                options.allow_volatile = match value {
                    "" | "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => {
                        return Err(StoreError::misconfigured(format!(
                            "failed to read allow_volatile={value:?} in the redis url: expected \
                             true or false"
                        )))
                    }
                }
            }
            "key_prefix" => options.key_prefix = value.to_owned(),
            "wait_replicas" => {
                replicas = Some(value.parse::<u32>().map_err(|_| {
                    StoreError::misconfigured(format!(
                        "failed to read wait_replicas={value:?} in the redis url: expected a \
                         number of replicas"
                    ))
                })?);
            }
            "wait_timeout" => timeout = Some(parse_wait_timeout(value)?),
            _ => rest.push(format!("{name}={value}")),
        }
    }
    match (replicas, timeout) {
        (None, None) => {}
        (None, Some(_)) => {
            return Err(StoreError::misconfigured(
                "failed to read wait_timeout in the redis url: it needs wait_replicas=N".to_owned(),
            ))
        }
        (Some(0), _) => options.wait_replicas = None,
        (Some(n), t) => options.wait_replicas = Some((n, t.unwrap_or(DEFAULT_WAIT_TIMEOUT))),
    }
    let url = if rest.is_empty() {
        query.base.to_owned()
    } else {
        format!("{}?{}", query.base, rest.join("&"))
    };
    Ok((url, options))
}

/// A `wait_timeout` value: milliseconds, or a number with `ms` or `s`; more than zero, since
/// `WAIT n 0` would wait forever.
pub(crate) fn parse_wait_timeout(value: &str) -> Result<Duration> {
    let (number, unit_ms) = if let Some(n) = value.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1000)
    } else {
        (value, 1)
    };
    match number.parse::<u64>() {
        Ok(n) if n > 0 && n <= MAX_MS / unit_ms => Ok(Duration::from_millis(n * unit_ms)),
        _ => Err(StoreError::misconfigured(format!(
            "failed to read wait_timeout={value:?} in the redis url: expected a duration above \
             zero such as 500ms or 2s"
        ))),
    }
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    let url = url.split_once('?').map_or(url, |(base, _)| base);
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, rest)), Some(at)) if at > scheme.len() => {
            let host = &url[at + 1..];
            let user = rest.split_once('@').map_or("", |(u, _)| u);
            let user = user.split_once(':').map_or(user, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// The parts of a `redis+sentinel://[user[:password]@]host:port[,host:port...]/service[/db][?query]`
/// URL: the sentinels, the service (master) name, and the credentials, database and driver
/// options for the primary; `None` for any other URL. The sentinels are reached with the
/// `sentinel_username` / `sentinel_password` of the query (percent-encoded), or without
/// credentials.
pub(crate) fn sentinel_parts(
    url: &str,
) -> Result<Option<(Vec<ConnectionInfo>, String, SentinelNodeConnectionInfo)>> {
    let Some(rest) = url.strip_prefix("redis+sentinel://") else {
        return Ok(None);
    };
    let bad = |why: &str| {
        StoreError::misconfigured(format!(
            "failed to read redis sentinel url {}: {why} (expected \
             redis+sentinel://[user:password@]host:port,host:port/service[/db][?options])",
            redact(url)
        ))
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut sentinel_auth = RedisConnectionInfo::default();
    let (mut has_user, mut has_password) = (false, false);
    let mut primary_query = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("sentinel_username", v) => {
                sentinel_auth = sentinel_auth.set_username(percent_decode(v).map_err(|w| bad(&w))?);
                has_user = true;
            }
            ("sentinel_password", v) => {
                sentinel_auth = sentinel_auth.set_password(percent_decode(v).map_err(|w| bad(&w))?);
                has_password = true;
            }
            _ => primary_query.push(pair),
        }
    }
    if has_user && !has_password {
        return Err(bad("sentinel_username needs sentinel_password"));
    }
    let query = match primary_query.is_empty() {
        true => String::new(),
        false => format!("?{}", primary_query.join("&")),
    };
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (service, db) = path.split_once('/').unwrap_or((path, ""));
    if service.is_empty() {
        return Err(bad(
            "the path must name the service (the master name the sentinels monitor)",
        ));
    }
    let sentinels: Vec<ConnectionInfo> = hosts
        .split(',')
        .map(|host| {
            let url = match host {
                "" => return Err(bad("empty sentinel address")),
                h if h.contains(':') => format!("redis://{h}"),
                h => format!("redis://{h}:26379"),
            };
            let info = redis::IntoConnectionInfo::into_connection_info(url)
                .map_err(|e| bad(&e.to_string()))?;
            Ok(info.set_redis_settings(sentinel_auth.clone()))
        })
        .collect::<Result<_>>()?;
    let node = redis::IntoConnectionInfo::into_connection_info(format!(
        "redis://{userinfo}primary/{db}{query}"
    ))
    .map_err(|e| bad(&e.to_string()))?;
    let node = SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(node.redis_settings().clone());
    Ok(Some((sentinels, service.to_owned(), node)))
}

/// A percent-encoded URL component as text (`%40` is `@`); an error says what is wrong, never
/// the value (it may be a password).
pub(crate) fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a credential has a '%' not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a credential is not UTF-8 once percent-decoded".to_owned())
}

/// The nodes of a `redis+cluster://[user[:password]@]host:port,host:port[/0][?query]` URL as
/// `redis://` URLs carrying the credentials and the driver's query options; `None` for any other
/// URL.
pub(crate) fn cluster_nodes(url: &str) -> Result<Option<Vec<String>>> {
    let Some(rest) = ["redis+cluster://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
    else {
        return Ok(None);
    };
    let bad = |why: &str| {
        StoreError::misconfigured(format!(
            "failed to read redis cluster url {}: {why} (expected \
             redis+cluster://[user:password@]host:port,host:port[?options])",
            redact(url)
        ))
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, format!("?{query}")),
        None => (rest, String::new()),
    };
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !matches!(path, "" | "0") {
        return Err(bad("a cluster has only database 0"));
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .map(|host| match host {
            "" => Err(bad("empty node address")),
            h => Ok(format!("redis://{userinfo}{h}{query}")),
        })
        .collect::<Result<_>>()?;
    Ok(Some(nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_settings_are_read_from_the_url() {
        let wait =
            |url: &str| parse_url(url, RedisOptions::default()).map(|(_, o)| o.wait_replicas);
        assert_eq!(
            wait("redis://h/?wait_replicas=1").unwrap(),
            Some((1, DEFAULT_WAIT_TIMEOUT))
        );
        assert_eq!(
            wait("redis://h/?wait_replicas=2&wait_timeout=250ms").unwrap(),
            Some((2, Duration::from_millis(250)))
        );
        assert_eq!(
            wait("redis://h/?wait_timeout=3s&wait_replicas=1").unwrap(),
            Some((1, Duration::from_secs(3)))
        );
        assert_eq!(
            wait("redis://h/?wait_replicas=1&wait_timeout=40").unwrap(),
            Some((1, Duration::from_millis(40)))
        );
        assert_eq!(wait("redis://h/?wait_replicas=0").unwrap(), None);
        assert_eq!(wait("redis://h/").unwrap(), None);
        let (url, _) = parse_url(
            "redis://h/?wait_replicas=1&protocol=resp3",
            RedisOptions::default(),
        )
        .unwrap();
        assert_eq!(
            url, "redis://h/?protocol=resp3",
            "the driver never sees them"
        );
        for (bad, says) in [
            ("redis://h/?wait_replicas=one", "wait_replicas=\"one\""),
            ("redis://h/?wait_replicas=-1", "wait_replicas=\"-1\""),
            (
                "redis://h/?wait_replicas=1&wait_timeout=0",
                "wait_timeout=\"0\"",
            ),
            (
                "redis://h/?wait_replicas=1&wait_timeout=2m",
                "wait_timeout=\"2m\"",
            ),
            ("redis://h/?wait_timeout=1s", "it needs wait_replicas"),
        ] {
            let e = wait(bad).unwrap_err();
            assert!(
                matches!(&e, StoreError::Misconfigured(m) if m.contains(says)),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn url_settings_are_taken_out_of_the_query() {
        let (url, o) = parse_url(
            "redis://127.0.0.1:6379/2?allow_volatile=true&protocol=resp3&key_prefix=t:",
            RedisOptions::default(),
        )
        .unwrap();
        assert_eq!(url, "redis://127.0.0.1:6379/2?protocol=resp3");
        assert!(o.allow_volatile);
        assert_eq!(o.key_prefix, "t:");
        let (url, o) =
            parse_url("redis://h/?allow_volatile=false", RedisOptions::default()).unwrap();
        assert_eq!(url, "redis://h/");
        assert!(!o.allow_volatile);
        assert!(parse_url("redis://h/?allow_volatile=maybe", RedisOptions::default()).is_err());
    }

    #[test]
    fn unknown_url_options_are_refused_by_name() {
        for (url, bad) in [
            ("redis://h/?prefx=x", "prefx"),
            (
                "redis://h/?key_prefix=a:&allow_volatil=true",
                "allow_volatil",
            ),
            // redis-rs reads these only from Unix-socket URLs; on TCP they would be ignored.
            ("redis://h/?db=3", "db"),
            ("redis://h/?pass=secret", "pass"),
        ] {
            let e = parse_url(url, RedisOptions::default()).unwrap_err();
            let StoreError::Misconfigured(m) = &e else {
                panic!("{url}: expected Misconfigured, got {e:?}")
            };
            assert!(m.contains(&format!("unknown option {bad:?}")), "{url}: {m}");
            assert!(
                m.contains("allow_volatile, key_prefix, protocol"),
                "{url}: {m}"
            );
            assert!(!m.contains("secret"), "{m}");
        }
        let (url, o) = parse_url(
            "redis+unix:///run/redis.sock?db=2&pass=pw&key_prefix=u:",
            RedisOptions::default(),
        )
        .unwrap();
        assert_eq!(url, "redis+unix:///run/redis.sock?db=2&pass=pw");
        assert_eq!(o.key_prefix, "u:");
    }

    #[test]
    fn cluster_urls_name_every_node_with_credentials_and_driver_options() {
        assert_eq!(cluster_nodes("redis://h:1").unwrap(), None);
        assert_eq!(
            cluster_nodes("redis+cluster://u:pw@h1:1,h2:2/?protocol=resp3").unwrap(),
            Some(vec![
                "redis://u:pw@h1:1?protocol=resp3".to_owned(),
                "redis://u:pw@h2:2?protocol=resp3".to_owned()
            ])
        );
        assert_eq!(
            cluster_nodes("redis+cluster://h1:1/0").unwrap(),
            Some(vec!["redis://h1:1".to_owned()])
        );
        let (url, o) = parse_url(
            "redis+cluster://h1:1,h2:2?key_prefix=c:&wait_replicas=1",
            RedisOptions::default(),
        )
        .unwrap();
        assert_eq!(url, "redis+cluster://h1:1,h2:2");
        assert_eq!(o.key_prefix, "c:");
        assert_eq!(o.wait_replicas, Some((1, DEFAULT_WAIT_TIMEOUT)));
        for bad in [
            "redis+cluster://u:secret@h1:1/2",
            "redis+cluster://u:secret@h1:1,",
        ] {
            let e = cluster_nodes(bad).unwrap_err();
            assert!(
                matches!(&e, StoreError::Misconfigured(m) if !m.contains("secret")),
                "{e:?}"
            );
        }
        assert_eq!(
            redact("redis+cluster://u:secret@h1:1,h2:2"),
            "redis+cluster://u:***@h1:1,h2:2"
        );
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_service() {
        assert!(sentinel_parts("redis://h:1").unwrap().is_none());
        let (sentinels, service, _) =
            sentinel_parts("redis+sentinel://u:pw@s1:5000,s2/mymaster/2?protocol=resp3")
                .unwrap()
                .unwrap();
        let addrs: Vec<String> = sentinels.iter().map(|s| s.addr().to_string()).collect();
        assert_eq!(addrs, ["s1:5000", "s2:26379"]);
        assert!(sentinels
            .iter()
            .all(|s| s.redis_settings().password().is_none()));
        assert_eq!(service, "mymaster");

        // The sentinels' own credentials, percent-decoded (the URL's user and password stay the
        // primary's).
        let (sentinels, _, _) = sentinel_parts(
            "redis+sentinel://u:pw@s1/m?sentinel_username=sen&sentinel_password=p%40ss%26w&protocol=resp3",
        )
        .unwrap()
        .unwrap();
        let auth = sentinels[0].redis_settings();
        assert_eq!(
            (auth.username(), auth.password()),
            (Some("sen"), Some("p@ss&w"))
        );
        for (bad, says) in [
            ("redis+sentinel://u:secret@s1:1", "must name the service"),
            (
                "redis+sentinel://u:secret@s1:1,/m",
                "empty sentinel address",
            ),
            (
                "redis+sentinel://s1/m?sentinel_username=secret",
                "needs sentinel_password",
            ),
            (
                "redis+sentinel://s1/m?sentinel_password=secret%zz",
                "two hex digits",
            ),
        ] {
            let e = sentinel_parts(bad).unwrap_err();
            assert!(
                matches!(&e, StoreError::Misconfigured(m) if m.contains(says) && !m.contains("secret")),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact("redis://u:secret@h:1/0?x=1"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn prefixes_with_glob_or_tag_characters_are_refused() {
        assert!(check_prefix("idemgate:").is_ok());
        assert!(check_prefix("").is_ok());
        for bad in ["a*", "a{", "a}", "a?", "a[", "a b"] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
    }
}
