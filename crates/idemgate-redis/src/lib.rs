#![doc = include_str!("../README.md")]

mod carried;
mod connection;
mod direct;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod options;
mod row;
mod wake;

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use idemgate_core::ReservePath;

pub use crate::carried::{Address as CarriedAddress, CarriedLink};
pub use crate::options::RedisOptions;

use idemgate_core::key::hex;
use idemgate_core::store::Result;
use idemgate_core::transition::{self, Change, StoredRecord};
use idemgate_core::{
    Cause, ChangeMark, Changes, Claim, Completion, Fence, HistoryEntry, Keep, Key, Lease,
    ListFilter, Outcome, Record, Reopened, Reservation, ReserveHistory, Store, StoreError,
    Timestamp,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisFuture, RedisResult, Script, ServerErrorKind,
    ToRedisArgs, Value,
};

use crate::carried::CarriedConn;
use crate::connection::{check_persistence, Conn, Invocation, Link, Node, Pinned, SentinelLink};
use crate::error::{classify, corrupt};
use crate::options::{check_prefix, cluster_nodes, parse_url, redact, sentinel_parts};
use crate::row::{array, hash_record, number, stored_record, text};

/// The longest duration sent to a script, in milliseconds (about 35,000 years). Scripts compute
/// in Lua doubles, exact up to 2^53; capping durations keeps every timestamp exact.
pub(crate) const MAX_MS: u64 = 1 << 50;

/// How many keys one `SCAN` step asks for.
const SCAN_COUNT: u64 = 500;

/// The Lua scripts, one per transition; [`Script`] loads them again after a `NOSCRIPT`.
#[derive(Debug)]
struct Scripts {
    reserve: Script,
    takeover: Script,
    heartbeat: Script,
    complete: Script,
    release: Script,
    mark_unknown: Script,
    reopen: Script,
    get: Script,
    append_history: Script,
    history: Script,
    purge: Script,
    wait: Script,
}

impl Scripts {
    fn new() -> Self {
        let common = include_str!("common.lua");
        let script = |body: &str| Script::new(&format!("{common}\n{body}"));
        Scripts {
            reserve: script(include_str!("reserve.lua")),
            takeover: script(include_str!("takeover.lua")),
            heartbeat: script(include_str!("heartbeat.lua")),
            complete: script(include_str!("complete.lua")),
            release: script(include_str!("release.lua")),
            mark_unknown: script(include_str!("mark_unknown.lua")),
            reopen: script(include_str!("reopen.lua")),
            get: script(include_str!("get.lua")),
            append_history: script(include_str!("append_history.lua")),
            history: script(include_str!("history.lua")),
            purge: script(include_str!("purge.lua")),
            wait: script(include_str!("wait.lua")),
        }
    }
}

/// Idempotency records in Redis: one hash per record, every transition one Lua script judged by
/// the server's clock. Clones share one multiplexed connection, which reconnects by itself.
///
/// # Concurrent calls on the same key
/// Each operation is one script, and Redis runs scripts one at a time, so racing reservations see
/// each other exactly as the memory store's lock makes them.
///
/// # Cancellation
/// A dropped future either never sent its script or sent all of it: Redis runs a script whole.
/// Whether a sent script ran is then unknown to the caller, as after a lost answer; retrying with
/// the same reservation token or lease is safe.
///
/// # Errors
/// See the crate's error mapping: [`StoreError::Unavailable`] when nothing was sent or Redis
/// refused the command, [`StoreError::Indeterminate`] when the answer was lost (timeout, broken
/// connection) or too few replicas acknowledged a write, [`StoreError::LeaseLost`] from the
/// scripts' compare-and-set, [`StoreError::Corrupt`] for records this version cannot read.
///
/// # Fences after Redis reaped a record
/// A completed record stays [`RedisOptions::expiry_grace`] past the point it stops counting (its
/// tombstone's end, or its expiry when it keeps none), so a reservation soon after continues its
/// fence (old fence + 1) as the contract says. Once Redis has reaped it (or a purge has deleted
/// it) the next reservation starts again at fence 1, as after a release; the random lease token
/// still keeps any holder of the old record from completing the new one.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    link: Link,
    scripts: Scripts,
    options: RedisOptions,
    /// The URL without credentials, for messages.
    shown_url: String,
    /// What recent reservations found, for [`ReservePath::Adaptive`].
    found: ReserveHistory,
    /// Wake-ups of waiting duplicates, from the subscriber ([`watch`]), by record name.
    changes: Arc<Changes>,
    /// Whether the subscriber's subscription is in effect.
    listening: tokio::sync::watch::Receiver<bool>,
    /// Dropped with the last clone, which stops the subscriber task.
    _subscriber: tokio::sync::oneshot::Sender<()>,
    /// Where a waiting caller's own connection goes (direct.rs), when the URL allows one.
    direct: Option<direct::Target>,
    /// The connection an event loop carries (carried.rs), when the URL allows one.
    carried: Option<Arc<CarriedLink>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.shown_url)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://[user:password@]host[:port][/db][?query]`; a
    /// Redis Cluster as `redis+cluster://[user:password@]host:port,host:port[?query]`; the primary
    /// that Redis Sentinel names as
    /// `redis+sentinel://[user:password@]host:port,host:port/service[/db][?query]`) with the
    /// default [`RedisOptions`]; the query may set `allow_volatile=true`, `key_prefix=...`,
    /// `wait_replicas=N` and `wait_timeout=...`, and
    /// redis-rs's own `protocol` (and, for `redis+unix://` URLs, `db`, `user` and `pass`).
    /// `docs/STORES.md` describes them.
    ///
    /// # Errors
    /// [`StoreError::Misconfigured`] for a bad URL, an unknown query option, or a Redis without
    /// append-only persistence (see [`RedisOptions::allow_volatile`]), [`StoreError::Unavailable`]
    /// when it cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to the Redis at `url` with `options` (settings in the URL's query win).
    ///
    /// # Errors
    /// As [`RedisStore::connect`].
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        let (url, options) = parse_url(url, options)?;
        check_prefix(&options.key_prefix)?;
        let shown_url = redact(&url);
        let bad_url = |e: redis::RedisError| {
            StoreError::Misconfigured(Cause::new(
                format!("failed to read redis url {shown_url}: {e}"),
                e,
            ))
        };
        let unreachable = |e: redis::RedisError| {
            StoreError::Unavailable(Cause::new(
                format!("failed to connect to redis at {shown_url}: {e}"),
                e,
            ))
        };
        // A command that waits for replicas must not time out before the wait does.
        let response_timeout = match (options.response_timeout, options.wait_replicas) {
            (Some(t), Some((_, wait))) => Some(t.max(wait + Duration::from_secs(1))),
            (t, _) => t,
        };
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(response_timeout)
            .set_connection_timeout(options.connection_timeout)
            .set_number_of_retries(4)
            .set_max_delay(Duration::from_millis(500));
        let mut direct = None;
        let mut carried = None;
        let (link, source) = if let Some(nodes) = cluster_nodes(&url)? {
            let source = wake::Source::Nodes(nodes.clone());
            let mut builder = ClusterClient::builder(nodes).retries(4).max_retry_wait(500);
            if let Some(t) = response_timeout {
                builder = builder.response_timeout(t);
            }
            if let Some(t) = options.connection_timeout {
                builder = builder.connection_timeout(t);
            }
            let client = builder.build().map_err(bad_url)?;
            let conn = Conn::Cluster(client.get_async_connection().await.map_err(unreachable)?);
            (Link::Fixed(conn), source)
        } else if let Some((sentinels, service, node)) = sentinel_parts(&url)? {
            let source = wake::Source::Sentinel {
                sentinels: sentinels.clone(),
                service: service.clone(),
                node: node.clone(),
            };
            let client =
                SentinelClient::build(sentinels, service, Some(node), SentinelServerType::Master)
                    .map_err(bad_url)?;
            let link = SentinelLink {
                client: tokio::sync::Mutex::new(client),
                current: std::sync::Mutex::new(None),
                resolutions: AtomicU64::new(0),
                config,
                resolve_timeout: options.connection_timeout.unwrap_or(Duration::from_secs(2)) * 3,
            };
            // Found now, so that a wrong service name or unreachable sentinels fail at start.
            link.primary().await.map_err(unreachable)?;
            (Link::Sentinel(Box::new(link)), source)
        } else {
            let client = redis::Client::open(url.as_str()).map_err(bad_url)?;
            direct = direct::Target::of(
                client.get_connection_info(),
                options.connection_timeout,
                response_timeout,
            );
            carried = direct.as_ref().map(|t| Arc::new(CarriedLink::of(t)));
            let conn = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(unreachable)?;
            (
                Link::Fixed(Conn::Single(conn)),
                wake::Source::Nodes(vec![url.clone()]),
            )
        };
        if !options.allow_volatile {
            let mut conn = match &link {
                Link::Fixed(conn) => conn.clone(),
                Link::Sentinel(s) => Conn::Single(s.primary().await.map_err(unreachable)?.1),
            };
            check_persistence(&mut conn, &shown_url).await?;
        }
        let changes = Arc::new(Changes::new());
        let (listening_tx, listening) = tokio::sync::watch::channel(false);
        let (subscriber, stop) = tokio::sync::oneshot::channel();
        tokio::spawn(wake::run(
            source,
            changes.clone(),
            listening_tx,
            options.connection_timeout.unwrap_or(Duration::from_secs(2)),
            stop,
        ));
        Ok(RedisStore {
            inner: Arc::new(Inner {
                link,
                scripts: Scripts::new(),
                options,
                shown_url,
                found: ReserveHistory::default(),
                changes,
                listening,
                _subscriber: subscriber,
                direct,
                carried,
            }),
        })
    }

    /// The Redis key name of a record: the prefix, then the hex SHA-256 of the record's name in a
    /// hash tag. Its length is fixed whatever the client key.
    pub fn record_key(&self, key: &Key) -> String {
        record_key(&self.inner.options.key_prefix, key)
    }

    /// The connection an event loop may carry for this store (carried.rs): the package of an
    /// event-loop language connects it and hands its bytes back and forth; `None` for a URL that
    /// needs the shared connection (Cluster, Sentinel, TLS, RESP3).
    pub fn carried_link(&self) -> Option<Arc<CarriedLink>> {
        self.inner.carried.clone()
    }

    /// The settings in force.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    /// Whether the subscription that wakes waiting duplicates is in effect now (while it is not,
    /// they poll).
    pub fn is_listening(&self) -> bool {
        *self.inner.listening.borrow()
    }

    /// Waits until the subscription that wakes waiting duplicates is in effect, at most
    /// `timeout`; returns whether it is. For callers (and tests) that measure wake-ups.
    pub async fn wait_listening(&self, timeout: Duration) -> bool {
        let mut listening = self.inner.listening.clone();
        tokio::time::timeout(timeout, listening.wait_for(|on| *on))
            .await
            .is_ok_and(|on| on.is_ok())
    }

    /// The connection for one operation: through Sentinel, the current primary's (found anew
    /// after a failure), kept for the whole operation so that a write and its `WAIT` share it.
    /// A caller that waits on its own thread (`idemgate_core::caller::waiting`) gets its own
    /// connection there instead (direct.rs), where the URL allows one.
    async fn conn(&self) -> Result<Pinned> {
        // Only a single server's URL has a target or a carried link (see `connect_with`).
        if let Some(link) = &self.inner.carried {
            if idemgate_core::caller::is_on_loop() && link.is_up() {
                return Ok(Pinned {
                    conn: Conn::Carried(CarriedConn(Arc::clone(link))),
                    generation: None,
                });
            }
        }
        if let Some(target) = &self.inner.direct {
            if idemgate_core::caller::waits() {
                let conn = direct::mine(&self.inner, target).map_err(|e| {
                    let message = format!(
                        "failed to connect to redis at {}: {e}",
                        self.inner.shown_url
                    );
                    StoreError::Unavailable(Cause::new(message, e))
                })?;
                return Ok(Pinned {
                    conn: Conn::Direct(conn),
                    generation: None,
                });
            }
        }
        match &self.inner.link {
            Link::Fixed(conn) => Ok(Pinned {
                conn: conn.clone(),
                generation: None,
            }),
            Link::Sentinel(s) => {
                let (generation, manager) = s.primary().await.map_err(|e| {
                    let message = format!(
                        "failed to find the redis primary through sentinel at {}: {e}",
                        self.inner.shown_url
                    );
                    StoreError::Unavailable(Cause::new(message, e))
                })?;
                Ok(Pinned {
                    conn: Conn::Single(manager),
                    generation: Some(generation),
                })
            }
        }
    }

    /// The store error for `e` on `pinned`; through Sentinel, any failure but a refusal by our
    /// scripts also makes the next operation ask the sentinels for the primary again (a failover
    /// shows as a lost connection, `READONLY` or a write its replicas did not acknowledge).
    fn fail(&self, pinned: &Pinned, e: &redis::RedisError, what: &str) -> StoreError {
        let err = classify(e, what);
        self.forget_on(pinned, &err);
        err
    }

    fn forget_on(&self, pinned: &Pinned, err: &StoreError) {
        if let (Link::Sentinel(s), Some(generation)) = (&self.inner.link, pinned.generation) {
            if matches!(
                err,
                StoreError::Unavailable(_) | StoreError::Indeterminate(_)
            ) {
                s.forget(generation);
            }
        }
    }

    /// Runs a read-only script.
    async fn read(&self, inv: &Invocation<'_>, what: &str) -> Result<Value> {
        let mut pinned = self.conn().await?;
        match inv.invoke(&mut pinned.conn).await {
            Ok(v) => Ok(v),
            Err(e) => Err(self.fail(&pinned, &e, what)),
        }
    }

    /// Runs a write script on the record `key` (its Redis name), and waits for replicas in the
    /// same pipeline if so configured (on a cluster, on the master of the key's slot).
    async fn write(&self, key: &str, inv: &Invocation<'_>, what: &str) -> Result<Value> {
        match self.write_replicated(key, inv, what).await? {
            (value, None) => Ok(value),
            (_, Some(short)) => Err(short),
        }
    }

    /// As [`RedisStore::write`], with the script's answer also when too few replicas
    /// acknowledged the write (then with the error that says so), for a caller that must know
    /// what the write did to undo it.
    async fn write_replicated(
        &self,
        key: &str,
        inv: &Invocation<'_>,
        what: &str,
    ) -> Result<(Value, Option<StoreError>)> {
        let mut pinned = self.conn().await?;
        let Some((replicas, timeout)) = self.inner.options.wait_replicas else {
            return inv
                .invoke(&mut pinned.conn)
                .await
                .map(|value| (value, None))
                .map_err(|e| self.fail(&pinned, &e, what));
        };
        let (value, acked) = inv
            .invoke_and_wait(&mut pinned.conn, key, replicas, timeout)
            .await
            .map_err(|e| self.fail(&pinned, &e, what))?;
        if acked >= i64::from(replicas) {
            return Ok((value, None));
        }
        let err = StoreError::indeterminate(format!(
            "failed to {what} on redis: {acked} of {replicas} replicas acknowledged the write \
             within {timeout:?}, so a failover could lose it"
        ));
        self.forget_on(&pinned, &err);
        Ok((value, Some(err)))
    }

    /// Takes back a fresh reservation too few replicas acknowledged (`short` says so): the call
    /// is refused and its side effect never runs, so a reservation left standing would only turn
    /// unknown when its lease ends and hold every retry for an operator. Released on the primary
    /// (replicas apply the release after the reservation, in order), the refusal is
    /// [`StoreError::Unavailable`]: nothing is held. When the release fails too, `short`.
    async fn take_back(&self, name: &str, lease: Lease, short: StoreError) -> StoreError {
        let inv = self.lease_call(&self.inner.scripts.release, name, lease);
        let released = match self.conn().await {
            Ok(mut pinned) => inv.invoke::<Value>(&mut pinned.conn).await.is_ok(),
            Err(_) => false,
        };
        match (released, short) {
            (true, StoreError::Indeterminate(why)) => StoreError::unavailable(format!(
                "{why}; the reservation was taken back, so nothing is held"
            )),
            (_, short) => short,
        }
    }

    async fn claim(&self, r: &Reservation, stale: Option<Fence>) -> Result<Claim> {
        let what = if stale.is_some() {
            "take over"
        } else {
            "reserve"
        };
        let script = match stale {
            Some(_) => &self.inner.scripts.takeover,
            None => &self.inner.scripts.reserve,
        };
        let name = self.record_key(&r.key);
        let reads_first = stale.is_none()
            && self.inner.options.wait_replicas.is_none()
            && self.inner.found.read_first(self.inner.options.reserve_path);
        if reads_first {
            // What the reserve script answers when a record counts, judged the same way on a
            // plain read; otherwise the script decides, on the record as it then stands.
            let (now, stored) = self.peek(&name).await?;
            if let (claim, Change::Keep) = transition::reserve(stored.as_ref(), r, now) {
                self.inner.found.record(true);
                return Ok(claim);
            }
        }
        let mut inv = Invocation::new(script);
        inv.key(&name)
            .arg(r.key.tenant.as_str())
            .arg(r.key.tool.as_str())
            .arg(r.key.key.as_str())
            .arg(r.fingerprint.to_hex())
            .arg(r.token.to_hex())
            .arg(ms(r.lease_for));
        if let Some(stale) = stale {
            inv.arg(stale.to_string());
        }
        // See scope_arg in common.lua.
        inv.arg(
            r.scope
                .as_deref()
                .map_or(String::new(), |s| format!("={s}")),
        );
        let (reply, short) = self.write_replicated(&name, &inv, what).await?;
        let items = array(&reply)?;
        match (items, short) {
            ([tag, fence], short) if text(tag)? == "A" => {
                self.inner.found.record(false);
                let lease = Lease {
                    fence: number(fence)?,
                    token: r.token,
                };
                match short {
                    None => Ok(Claim::Acquired(lease)),
                    // A fresh reservation is taken back; a takeover stays as it landed, for the
                    // engine to mark unknown again (the action may have run before).
                    Some(short) if stale.is_none() => {
                        Err(self.take_back(&name, lease, short).await)
                    }
                    Some(short) => Err(short),
                }
            }
            (_, Some(short)) => Err(short),
            ([tag, now, flat], None) if text(tag)? == "E" => {
                self.inner.found.record(true);
                let now = Timestamp::from_millis(number(now)?);
                let record = stored_record(flat)?
                    .and_then(|c| c.view(now))
                    .ok_or_else(|| corrupt(format_args!("{what} script returned no record")))?;
                Ok(Claim::Existing(record))
            }
            _ => Err(corrupt(format_args!(
                "{what} script answered {reply:?}, expected a claim"
            ))),
        }
    }

    fn lease_call<'a>(&self, script: &'a Script, name: &str, lease: Lease) -> Invocation<'a> {
        let mut inv = Invocation::new(script);
        inv.key(name)
            .arg(lease.fence.to_string())
            .arg(lease.token.to_hex());
        inv
    }

    /// The key names of all records under the prefix (deduplicated: `SCAN` may repeat keys), by
    /// the node that holds them: one group on a single server, one per master of a cluster.
    async fn scan(&self, pinned: &mut Pinned) -> Result<Vec<(Option<Node>, Vec<String>)>> {
        let prefix = &self.inner.options.key_prefix;
        let pattern = format!("{prefix}{{*}}");
        let mut conn = pinned.conn.clone();
        let fail = |e: redis::RedisError| self.fail(pinned, &e, "scan records");
        let mut groups = Vec::new();
        for node in conn.masters().await.map_err(fail)? {
            let mut seen = HashSet::new();
            let mut cursor: u64 = 0;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, names): (u64, Vec<String>) =
                    conn.on(node.as_ref(), &cmd).await.map_err(fail)?;
                seen.extend(names.into_iter().filter(|n| is_record_key(prefix, n)));
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            groups.push((node, seen.into_iter().collect()));
        }
        Ok(groups)
    }

    /// The record under `name` (its Redis name) and the server time, read with plain commands:
    /// `TIME` and `HGETALL` in one pipeline on the record's node, no script.
    async fn peek(&self, name: &str) -> Result<(Timestamp, Option<StoredRecord>)> {
        let mut pinned = self.conn().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("TIME").cmd("HGETALL").arg(name);
        let ((secs, micros), hash): ((i64, i64), Value) =
            match pinned.conn.pipe_on_slot(name, pipe).await {
                Ok(reply) => reply,
                Err(e) => return Err(self.fail(&pinned, &e, "read a record")),
            };
        Ok((time_reply(secs, micros), hash_record(&hash)?))
    }

    /// The server's clock.
    async fn server_now(&self) -> Result<Timestamp> {
        let mut pinned = self.conn().await?;
        let (secs, micros): (i64, i64) =
            match redis::cmd("TIME").query_async(&mut pinned.conn).await {
                Ok(t) => t,
                Err(e) => return Err(self.fail(&pinned, &e, "read the server time")),
            };
        Ok(time_reply(secs, micros))
    }
}

/// The instant of a `TIME` reply (seconds, microseconds), in milliseconds as the scripts'
/// `now_ms()` counts them.
fn time_reply(secs: i64, micros: i64) -> Timestamp {
    Timestamp::from_millis(secs * 1000 + micros / 1000)
}

impl Store for RedisStore {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        self.claim(r, None).await
    }

    async fn takeover(&self, r: &Reservation, stale: Fence) -> Result<Claim> {
        self.claim(r, Some(stale)).await
    }

    async fn heartbeat(&self, key: &Key, lease: Lease, lease_for: Duration) -> Result<Timestamp> {
        let name = self.record_key(key);
        let mut inv = self.lease_call(&self.inner.scripts.heartbeat, &name, lease);
        inv.arg(ms(lease_for));
        let reply = self.write(&name, &inv, "extend a lease").await?;
        Ok(Timestamp::from_millis(number(&reply)?))
    }

    async fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>,
    ) -> Result<Completion> {
        let name = self.record_key(key);
        let mut inv = self.lease_call(&self.inner.scripts.complete, &name, lease);
        inv.arg(outcome.kind.to_string())
            .arg(outcome.body.as_slice())
            .arg(ms(keep.ttl))
            // How long the record counts, as `Keep::retain_until` reckons it.
            .arg(ms(keep.ttl.max(keep.tombstone)))
            .arg(ms(self.inner.options.expiry_grace))
            .arg(executed_at.map_or(String::new(), |t| t.as_millis().to_string()));
        let reply = self.write(&name, &inv, "complete a record").await?;
        match array(&reply)? {
            [completed_at, expires_at] => Ok(Completion {
                completed_at: Timestamp::from_millis(number(completed_at)?),
                expires_at: Timestamp::from_millis(number(expires_at)?),
            }),
            _ => Err(corrupt(format_args!(
                "complete script answered {reply:?}, expected two times"
            ))),
        }
    }

    async fn release(&self, key: &Key, lease: Lease) -> Result<()> {
        let name = self.record_key(key);
        let inv = self.lease_call(&self.inner.scripts.release, &name, lease);
        self.write(&name, &inv, "release a record").await.map(drop)
    }

    async fn mark_unknown(&self, key: &Key, lease: Lease) -> Result<()> {
        let name = self.record_key(key);
        let inv = self.lease_call(&self.inner.scripts.mark_unknown, &name, lease);
        self.write(&name, &inv, "mark a record unknown")
            .await
            .map(drop)
    }

    async fn reopen(&self, key: &Key, fence: Fence) -> Result<Reopened> {
        let name = self.record_key(key);
        let mut inv = Invocation::new(&self.inner.scripts.reopen);
        inv.key(&name)
            .arg(fence.to_string())
            .arg(ms(self.inner.options.expiry_grace));
        let reply = self.write(&name, &inv, "reopen a record").await?;
        match array(&reply)? {
            [tag] if text(tag)? == "R" => Ok(Reopened::Expired),
            [tag, now, flat] if text(tag)? == "K" => {
                let now = Timestamp::from_millis(number(now)?);
                Ok(Reopened::Kept(
                    stored_record(flat)?.and_then(|c| c.view(now)),
                ))
            }
            _ => Err(corrupt(format_args!(
                "reopen script answered {reply:?}, expected whether it reopened the record"
            ))),
        }
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let mut inv = Invocation::new(&self.inner.scripts.get);
        inv.key(self.record_key(key));
        let reply = self.read(&inv, "read a record").await?;
        match array(&reply)? {
            [now, flat] => {
                let now = Timestamp::from_millis(number(now)?);
                Ok(stored_record(flat)?.and_then(|c| c.view(now)))
            }
            _ => Err(corrupt(format_args!(
                "get script answered {reply:?}, expected a time and a record"
            ))),
        }
    }

    async fn append_history(&self, key: &Key, entry: &HistoryEntry) -> Result<bool> {
        let name = self.record_key(key);
        let mut inv = Invocation::new(&self.inner.scripts.append_history);
        inv.key(&name).arg(entry.to_line() + "\n");
        let reply = self
            .write(&name, &inv, "append to a record's history")
            .await?;
        Ok(number::<i64>(&reply)? == 1)
    }

    async fn history(&self, key: &Key) -> Result<Vec<HistoryEntry>> {
        let mut inv = Invocation::new(&self.inner.scripts.history);
        inv.key(self.record_key(key));
        let reply = self.read(&inv, "read a record's history").await?;
        let text = match &reply {
            Value::Nil => "",
            v => text(v)?,
        };
        HistoryEntry::from_lines(text).map_err(|e| {
            corrupt(format_args!(
                "the history of record {key} is unreadable: {e}"
            ))
        })
    }

    fn change_mark(&self, key: &Key) -> ChangeMark {
        self.inner.changes.mark(self.record_key(key).as_str())
    }

    async fn wait_changed(&self, key: &Key, since: ChangeMark, timeout: Duration) {
        if !self.is_listening() {
            tokio::time::sleep(timeout.min(idemgate_core::store::DEFAULT_POLL)).await;
            return;
        }
        let name = self.record_key(key);
        // Flag the record as waited for, so that the write that settles it publishes its name. A
        // record with nothing to wait for needs no wait; a store that cannot be reached leaves
        // the wait to the timeout. A settling between the caller's mark and this flag is seen
        // here (the record is no longer in flight) or has moved the mark (its publish came
        // after a flag set by an earlier wait).
        let mut inv = Invocation::new(&self.inner.scripts.wait);
        inv.key(name.as_str());
        if let Ok(Value::Int(0)) = self.read(&inv, "wait for a record").await {
            return;
        }
        self.inner.changes.wait(name.as_str(), since, timeout).await;
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let now = self.server_now().await?;
        let mut out = Vec::new();
        let mut pinned = self.conn().await?;
        for (node, names) in self.scan(&mut pinned).await? {
            for batch in names.chunks(SCAN_COUNT as usize) {
                let mut pipe = redis::pipe();
                for name in batch {
                    pipe.cmd("HGETALL").arg(name);
                }
                let hashes: Vec<Value> = pinned
                    .conn
                    .clone()
                    .pipe_on(node.as_ref(), pipe)
                    .await
                    .map_err(|e| self.fail(&pinned, &e, "list records"))?;
                for hash in &hashes {
                    // A record deleted since the scan reads as an empty hash: absent.
                    if let Some(record) = hash_record(hash)?.and_then(|c| c.view(now)) {
                        if filter.matches(&record) {
                            out.push(record);
                        }
                    }
                }
            }
        }
        out.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
        if filter.limit > 0 {
            out.truncate(filter.limit);
        }
        Ok(out)
    }

    async fn purge_expired(&self) -> Result<u64> {
        let now = self.server_now().await?;
        let mut purged = 0;
        let mut pinned = self.conn().await?;
        for (node, names) in self.scan(&mut pinned).await? {
            for batch in names.chunks(SCAN_COUNT as usize) {
                let mut pipe = redis::pipe();
                for name in batch {
                    pipe.cmd("HMGET")
                        .arg(name)
                        .arg("state")
                        .arg("expires_at")
                        .arg("retain_until");
                    // Whether a tombstone still has a body to drop, without reading the body.
                    pipe.cmd("HSTRLEN").arg(name).arg("body");
                }
                let replies: Vec<Value> = pinned
                    .conn
                    .clone()
                    .pipe_on(node.as_ref(), pipe)
                    .await
                    .map_err(|e| self.fail(&pinned, &e, "purge records"))?;
                if replies.len() != 2 * batch.len() {
                    return Err(corrupt(format_args!(
                        "purge look answered {} replies for {} records",
                        replies.len(),
                        batch.len()
                    )));
                }
                for (name, look) in batch.iter().zip(replies.chunks_exact(2)) {
                    let (state, expires_at, retain_until): (
                        Option<String>,
                        Option<i64>,
                        Option<i64>,
                    ) = redis::from_redis_value(look[0].clone()).map_err(|e| {
                        corrupt(format_args!("record fields read for purging: {e}"))
                    })?;
                    let body_len: u64 = number(&look[1])?;
                    let past = |t: Option<i64>| t.is_some_and(|t| Timestamp::from_millis(t) <= now);
                    // As transition::purge: delete past the tombstone (a record written before
                    // tombstones kept none), drop the body of a tombstone that still has one.
                    let gone = past(retain_until.or(expires_at));
                    let compact = past(expires_at) && body_len > 0;
                    if state.as_deref() == Some("c") && (gone || compact) {
                        // The script checks again by the server clock, atomically, so a record
                        // reserved anew since the look above stays; it answers 1 only when it
                        // deleted the record.
                        let mut inv = Invocation::new(&self.inner.scripts.purge);
                        inv.key(name);
                        let gone: u64 = number(&self.write(name, &inv, "purge records").await?)?;
                        purged += gone;
                    }
                }
            }
        }
        Ok(purged)
    }
}

/// Whole milliseconds of `d`, capped at [`MAX_MS`].
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).min(MAX_MS)
}

fn record_key(prefix: &str, key: &Key) -> String {
    format!("{prefix}{{{}}}", hex(&key.digest()))
}

fn is_record_key(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('{'))
        .and_then(|rest| rest.strip_suffix('}'))
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_are_recognised() {
        let key = idemgate_core::Key::new(
            "t".parse().unwrap(),
            "tool".parse().unwrap(),
            "k".parse().unwrap(),
        );
        let name = record_key("p:", &key);
        assert_eq!(name.len(), "p:".len() + 66);
        assert!(is_record_key("p:", &name));
        assert!(!is_record_key("q:", &name));
        assert!(!is_record_key("p:", "p:{abc}"));
    }

    #[test]
    fn durations_are_capped() {
        assert_eq!(ms(Duration::from_millis(1500)), 1500);
        assert_eq!(ms(Duration::MAX), MAX_MS);
    }
}
