//! How the store reaches Redis: one server (or a primary behind replicas), a Redis Cluster, or
//! the primary that Sentinel names; a script's call with its `WAIT`; and the persistence check.

use super::*;
use crate::carried::CarriedConn;
use crate::direct::DirectConn;

/// The connection of a store: one server (or a primary behind replicas) through a reconnecting
/// manager, or a Redis Cluster, whose connection routes each command to the master of its key's
/// slot. The store's code is the same for both; only waiting for replicas, scanning and
/// per-node settings differ.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// A waiting caller's own connection to the single server (direct.rs).
    Direct(DirectConn),
    /// The connection to the single server an event loop carries (carried.rs).
    Carried(CarriedConn),
}

/// How a store reaches Redis: a fixed connection, or the primary that the sentinels name.
pub(crate) enum Link {
    Fixed(Conn),
    Sentinel(Box<SentinelLink>),
}

/// The connection of one operation, and through Sentinel which resolution of the primary it is.
pub(crate) struct Pinned {
    pub(crate) conn: Conn,
    pub(crate) generation: Option<u64>,
}

/// The primary behind Redis Sentinel: found through the sentinels when first needed and again
/// after any operation on it failed, so that a store follows a failover.
pub(crate) struct SentinelLink {
    pub(crate) client: tokio::sync::Mutex<SentinelClient>,
    /// The current primary's connection and its resolution number.
    pub(crate) current: std::sync::Mutex<Option<(u64, ConnectionManager)>>,
    pub(crate) resolutions: AtomicU64,
    pub(crate) config: ConnectionManagerConfig,
    /// The longest a resolution (sentinels, then the primary) may take.
    pub(crate) resolve_timeout: Duration,
}

impl SentinelLink {
    pub(crate) fn current(&self) -> Option<(u64, ConnectionManager)> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The primary's connection, asking the sentinels for it when none is current.
    pub(crate) async fn primary(&self) -> RedisResult<(u64, ConnectionManager)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let mut client = self.client.lock().await;
        // Another operation may have found it while this one waited for the lock.
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let timed_out = || {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer from the sentinels and the primary they name in time",
            ))
        };
        let found = tokio::time::timeout(self.resolve_timeout, async {
            let primary = client.async_get_client().await?;
            ConnectionManager::new_with_config(primary, self.config.clone()).await
        })
        .await
        .map_err(|_| timed_out())??;
        let generation = self.resolutions.fetch_add(1, Ordering::Relaxed) + 1;
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((generation, found.clone()));
        Ok((generation, found))
    }

    /// Drops resolution `generation` if it is still the current one, so that the next operation
    /// asks the sentinels again.
    pub(crate) fn forget(&self, generation: u64) {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }
}

/// A call of one of the store's scripts. Unlike redis-rs's `ScriptInvocation`, its keys and
/// arguments stay at hand, so that a write and its `WAIT` can go out in one pipeline on one
/// connection.
pub(crate) struct Invocation<'a> {
    pub(crate) script: &'a Script,
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) args: Vec<Vec<u8>>,
}

impl<'a> Invocation<'a> {
    pub(crate) fn new(script: &'a Script) -> Self {
        Invocation {
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// `EVALSHA hash numkeys keys... args...`.
    pub(crate) fn evalsha(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash()).arg(self.keys.len());
        for part in self.keys.iter().chain(&self.args) {
            cmd.arg(part.as_slice());
        }
        cmd
    }

    /// Runs the script on `conn`, loading it first when the server does not know it (a
    /// `NOSCRIPT` refusal ran nothing, so the call is sent again).
    pub(crate) async fn invoke<T: FromRedisValue>(&self, conn: &mut Conn) -> RedisResult<T> {
        match self.evalsha().query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.evalsha().query_async(conn).await
            }
            other => other,
        }
    }

    /// Runs the script and `WAIT replicas timeout` in one pipeline on one connection, so that
    /// the `WAIT` counts the acknowledgements of this very write: sent apart, a reconnection in
    /// between would put the `WAIT` on a fresh connection with nothing to wait for, and it would
    /// acknowledge at once. On a cluster both go to the master of `key`'s slot, where the write
    /// runs. Returns the script's answer and the replicas that acknowledged.
    pub(crate) async fn invoke_and_wait(
        &self,
        conn: &mut Conn,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<(Value, i64)> {
        let pipeline = || {
            let mut pipe = redis::pipe();
            pipe.add_command(self.evalsha());
            pipe.cmd("WAIT").arg(replicas).arg(ms(timeout));
            pipe
        };
        match conn.pipe_on_slot(key, pipeline()).await {
            // The script did not run: its WAIT waited for nothing. Load it and send both again.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                conn.pipe_on_slot(key, pipeline()).await
            }
            other => other,
        }
    }
}

/// A node of a cluster, as `host:port` (the address the cluster reports).
pub(crate) type Node = (String, u16);

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Direct(c) => c.req_packed_command(cmd),
            Conn::Carried(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Direct(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Carried(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Direct(c) => c.get_db(),
            Conn::Carried(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Runs `pipe` on the node that holds `key`: on a cluster, its slot's master, named
    /// explicitly rather than left to the driver's routing of the pipeline's first keyed command.
    pub(crate) async fn pipe_on_slot<T: FromRedisValue>(
        &mut self,
        key: &str,
        pipe: Pipeline,
    ) -> RedisResult<T> {
        match self {
            Conn::Single(c) => pipe.query_async(c).await,
            Conn::Direct(c) => pipe.query_async(c).await,
            Conn::Carried(c) => pipe.query_async(c).await,
            Conn::Cluster(c) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    key.as_bytes(),
                    SlotAddr::Master,
                ));
                let n = pipe.len();
                let replies = c.route_pipeline(pipe, 0, n, route).await?;
                Ok(redis::from_redis_value(
                    Value::Array(replies).extract_error()?,
                )?)
            }
        }
    }

    /// The nodes to scan: `[None]` for a single server, every master of a cluster.
    pub(crate) async fn masters(&mut self) -> RedisResult<Vec<Option<Node>>> {
        match self {
            Conn::Single(_) | Conn::Direct(_) | Conn::Carried(_) => Ok(vec![None]),
            Conn::Cluster(c) => {
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let replies = c.route_command(redis::cmd("PING"), all).await?;
                Ok(per_node(replies)?
                    .into_iter()
                    .map(|(node, _)| Some(node))
                    .collect())
            }
        }
    }

    /// Runs `cmd` on `node` (`None`: the single server, or wherever the cluster routes it).
    pub(crate) async fn on<T: redis::FromRedisValue>(
        &mut self,
        node: Option<&Node>,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let reply = c.route_command(cmd.clone(), routing).await?;
                Ok(redis::from_redis_value(reply.extract_error()?)?)
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }

    /// Runs a pipeline of commands on keys of `node` (see [`Conn::on`]).
    pub(crate) async fn pipe_on<T: redis::FromRedisValue>(
        &mut self,
        node: Option<&Node>,
        pipe: Pipeline,
    ) -> RedisResult<T> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                let n = pipe.len();
                let replies = c.route_pipeline(pipe, 0, n, route).await?;
                let replies = Value::Array(replies).extract_error()?;
                Ok(redis::from_redis_value(replies)?)
            }
            (conn, _) => pipe.query_async(conn).await,
        }
    }

    /// `CONFIG GET name` on every node that could hold records: the single server, or every
    /// node of a cluster (replicas included: one may be promoted). `None` names the single server.
    pub(crate) async fn config_get(
        &mut self,
        name: &str,
    ) -> RedisResult<Vec<(Option<Node>, Vec<String>)>> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        match self {
            Conn::Single(c) => Ok(vec![(None, cmd.query_async(c).await?)]),
            Conn::Direct(c) => Ok(vec![(None, cmd.query_async(c).await?)]),
            Conn::Carried(c) => Ok(vec![(None, cmd.query_async(c).await?)]),
            Conn::Cluster(c) => {
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
                let replies = c.route_command(cmd, all).await?;
                per_node(replies)?
                    .into_iter()
                    .map(|(node, v)| Ok((Some(node), redis::from_redis_value(v.extract_error()?)?)))
                    .collect()
            }
        }
    }
}

/// The replies of a command sent to several cluster nodes, by node.
pub(crate) fn per_node(replies: Value) -> RedisResult<Vec<(Node, Value)>> {
    let bad = |what: String| {
        redis::RedisError::from((
            redis::ErrorKind::Client,
            "unexpected reply from the cluster",
            what,
        ))
    };
    let Value::Map(pairs) = replies else {
        return Err(bad(format!("expected replies by node, got {replies:?}")));
    };
    pairs
        .into_iter()
        .map(|(addr, value)| {
            let addr: String = redis::from_redis_value(addr)?;
            let node = addr
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_owned(), p.parse().ok()?)))
                .ok_or_else(|| bad(format!("node address {addr:?}")))?;
            Ok((node, value))
        })
        .collect()
}

/// Refuses a Redis that would forget acknowledged records when it restarts: on a cluster, every
/// node must persist (a replica may become the master of its slots).
pub(crate) async fn check_persistence(conn: &mut Conn, url: &str) -> Result<()> {
    // In the words of those who set it: the store URL of `--store`, `IDEMGATE_STORE`, the
    // gateway's `store = "..."` or the Python package's `Engine.open(...)`.
    let how = format!(
        "enable append-only persistence (appendonly yes, appendfsync always or everysec), or \
         accept losing records on a restart by adding allow_volatile=true to the store URL: \
         {url}?allow_volatile=true (or &allow_volatile=true after its other options), as given \
         to --store, IDEMGATE_STORE or store = \"...\" in the gateway's configuration (in Rust, \
         RedisOptions::allow_volatile)"
    );
    let unreadable = |e: redis::RedisError| {
        let message = format!(
            "failed to read the persistence settings of redis at {url} (CONFIG GET appendonly: \
             {e}; managed services often disable CONFIG), so it may lose records on a restart: \
             {how}"
        );
        StoreError::Misconfigured(Cause::new(message, e))
    };
    let aof = match conn.config_get("appendonly").await {
        Ok(nodes) => nodes,
        Err(e) if e.is_io_error() => return Err(classify(&e, "read the persistence settings")),
        Err(e) => return Err(unreadable(e)),
    };
    let fsync = conn
        .config_get("appendfsync")
        .await
        .map_err(|e| classify(&e, "read the persistence settings"))?;
    for (node, aof) in aof {
        let at = match &node {
            Some((host, port)) => format!("{url} (node {host}:{port})"),
            None => url.to_owned(),
        };
        match aof.as_slice() {
            [_, on] if on == "yes" => {}
            [_, value] => {
                let save = conn
                    .config_get("save")
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .find(|(n, _)| *n == node)
                    .and_then(|(_, v)| v.get(1).cloned())
                    .unwrap_or_else(|| "?".to_owned());
                return Err(StoreError::misconfigured(format!(
                    "redis at {at} runs with appendonly {value} (save {save:?}), so it loses \
                     reservations and outcomes when it restarts and side effects could run twice: \
                     {how}"
                )));
            }
            _ => {
                return Err(StoreError::misconfigured(format!(
                    "redis at {at} did not report its appendonly setting, so it may lose records \
                     on a restart: {how}"
                )))
            }
        }
        // An append-only file that Redis never fsyncs (`appendfsync no`) is written back when the
        // operating system likes (up to about 30 s on Linux), so a power cut or a crash of the
        // machine loses acknowledged reservations as surely as `appendonly no` does.
        let policy = fsync
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, v)| v.as_slice());
        if let Some([_, policy]) = policy {
            if policy == "no" {
                return Err(StoreError::misconfigured(format!(
                    "redis at {at} runs with appendfsync no, so a crash of its machine loses \
                     reservations and outcomes it acknowledged and side effects could run twice: \
                     {how}"
                )));
            }
        }
    }
    Ok(())
}
