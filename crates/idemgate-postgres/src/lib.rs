#![doc = include_str!("../README.md")]

mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod options;
#[cfg(test)]
mod plans;
mod row;
mod schema;
mod shared_read;
mod wake;

use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::{
    HookError, Manager, ManagerConfig, Object, Pool, QueueMode, RecyclingMethod, Runtime,
};
use idemgate_core::key::hex;
use idemgate_core::store::{
    Claim, Completion, Keep, ListFilter, Reopened, Reservation, ReserveHistory, Result, Store,
};
use idemgate_core::time::duration_millis;
use idemgate_core::transition::{self, Change};
use idemgate_core::url::UrlQuery;
use idemgate_core::{
    Cause, ChangeMark, Fence, HistoryEntry, Key, Lease, Outcome, Record, RecordState, State,
    StoreError, Timestamp,
};
use tokio::sync::{broadcast, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use crate::options::{own_options, probe_idle_connections, OWN_OPTIONS, URL_OPTIONS};
use crate::row::{decode, fence_param, get, key_of, lease_of, outcome_kind_code, token_bytes};

pub use crate::options::{PgOptions, SyncCommit};
pub use crate::schema::SCHEMA_VERSION;
pub use idemgate_core::ReservePath;

/// The statements, with the schema filled in.
#[derive(Debug)]
struct Sql {
    insert: String,
    renew: String,
    takeover: String,
    heartbeat: String,
    complete: String,
    completed: String,
    release: String,
    mark_unknown: String,
    reopen: String,
    get: String,
    append_history: String,
    history: String,
    list: String,
    count: String,
    purge: String,
    wait: String,
}

impl Sql {
    fn new(schema: &str) -> Self {
        let ident = schema::quote_ident(schema);
        let fill = |s: &str| s.replace("{schema}", &ident);
        Sql {
            insert: fill(include_str!("sql/insert.sql")),
            renew: fill(include_str!("sql/renew.sql")),
            takeover: fill(include_str!("sql/takeover.sql")),
            heartbeat: fill(include_str!("sql/heartbeat.sql")),
            complete: fill(include_str!("sql/complete.sql")),
            completed: fill(include_str!("sql/completed.sql")),
            release: fill(include_str!("sql/release.sql")),
            mark_unknown: fill(include_str!("sql/mark_unknown.sql")),
            reopen: fill(include_str!("sql/reopen.sql")),
            get: fill(include_str!("sql/get.sql")),
            append_history: fill(include_str!("sql/append_history.sql")),
            history: fill(include_str!("sql/history.sql")),
            list: fill(include_str!("sql/list.sql")),
            count: fill(include_str!("sql/count.sql")),
            purge: fill(include_str!("sql/purge.sql")),
            wait: fill(include_str!("sql/wait.sql")),
        }
    }
}

/// Idempotency records in a Postgres table, judged by the server clock. Clones share the pool and
/// the listener connection.
///
/// # Concurrent calls on the same key
/// Every write is one statement (see the README); racing reservations are decided by the
/// primary key, and every write naming a lease is a compare-and-set on `(fence, token)` that
/// Postgres re-checks on the newest committed row version.
///
/// # Cancellation
/// Dropping a future leaves each statement either committed or not: the record is never half
/// written. A statement whose answer was abandoned may still commit.
///
/// # Errors
/// See `src/error.rs`: nothing sent is [`StoreError::Unavailable`], sent but unanswered is
/// [`StoreError::Indeterminate`].
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    sql: Sql,
    options: PgOptions,
    changes: broadcast::Sender<Arc<str>>,
    /// Whether the listener's `LISTEN` is in effect (always false without a listener).
    listening: watch::Receiver<bool>,
    /// Dropped with the last clone, which stops the listener task.
    _listener: Option<oneshot::Sender<()>>,
    /// What recent reservations found, for [`ReservePath::Adaptive`].
    found: ReserveHistory,
    /// Reads of a record that callers asking at once share (`get`).
    reads: shared_read::SharedReads,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.inner.pool.status();
        f.debug_struct("PgStore")
            .field("schema", &self.inner.options.schema)
            .field("pool_size", &status.size)
            .field("pool_available", &status.available)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// How long a standby that has not yet reported its flush position may take to do so before it
/// counts as asynchronous (see [`check_replication`]).
const REPORT_WAIT: Duration = Duration::from_secs(2);
/// How often a reservation runs again when a concurrent writer committed after its snapshot.
const RACE_ATTEMPTS: usize = 8;
/// How often a statement runs again after a serialization failure or deadlock.
const CONFLICT_RETRIES: u32 = 3;

impl PgStore {
    /// Connects with default [`PgOptions`] to a `postgres://` or `postgresql://` URL.
    ///
    /// # Errors
    /// See [`PgStore::connect_with`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PgOptions::default()).await
    }

    /// Connects to a `postgres://` or `postgresql://` URL: opens the pool, checks durability and
    /// replication, applies migrations under an advisory lock, and starts the listener
    /// connection. The URL's `allow_async_replication` wins over
    /// [`PgOptions::allow_async_replication`].
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the server cannot be reached, [`StoreError::Misconfigured`]
    /// for a bad URL (or a query option neither the store nor tokio-postgres reads, see
    /// `docs/STORES.md`), a schema newer than this code, (with [`SyncCommit::Refuse`]) a server
    /// that may lose acknowledged commits, or (without
    /// [`PgOptions::allow_async_replication`]) a primary that streams to asynchronous standbys.
    pub async fn connect_with(url: &str, options: PgOptions) -> Result<Self> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(StoreError::misconfigured(
                "failed to read the store URL: expected postgres:// or postgresql://".to_owned(),
            ));
        }
        // tokio-postgres refuses an unknown option too, but without naming it.
        let query = UrlQuery::parse(url, "postgres", &[OWN_OPTIONS, URL_OPTIONS].concat())?;
        let (url, options) = own_options(url, &query, options)?;
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::Misconfigured(Cause::new(
                format!("failed to read the Postgres URL: {e}"),
                e,
            ))
        })?;
        probe_idle_connections(&mut config, &query);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("idemgate");
        }
        let setup = Arc::<str>::from(session_setup(&options));
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let hook = deadpool_postgres::Hook::async_fn(move |client, _| {
            let setup = Arc::clone(&setup);
            Box::pin(async move {
                client
                    .batch_execute(&setup)
                    .await
                    .map_err(HookError::Backend)
            })
        });
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            // First in, first out (deadpool's default), on purpose. Last in, first out kept a
            // lone caller on one warm connection (fresh calls 0.92-0.99x the floor instead of
            // 0.89x), but made the conformance test `dropped_reservations_leave_consistent_state`
            // fail 7 times in 12: an insert of a cancelled reservation landed after the round
            // had released the key, leaving a record that no caller holds.
            .queue_mode(QueueMode::Fifo)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .runtime(Runtime::Tokio1)
            .post_create(hook)
            .build()
            .map_err(|e| {
                StoreError::Misconfigured(Cause::new(format!("failed to build the pool: {e}"), e))
            })?;

        let mut client = pool.get().await.map_err(error::pool)?;
        check_durability(&client, options.synchronous_commit).await?;
        if !options.allow_async_replication {
            check_replication(&client).await?;
        }
        schema::migrate(&mut client, &options.schema).await?;
        drop(client);

        let (changes, _) = broadcast::channel(1024);
        let (listening_tx, listening) = watch::channel(false);
        let listener = if options.listen {
            let (stop, stopped) = oneshot::channel();
            tokio::spawn(wake::run(config, changes.clone(), listening_tx, stopped));
            Some(stop)
        } else {
            None
        };
        Ok(PgStore {
            inner: Arc::new(Inner {
                pool,
                sql: Sql::new(&options.schema),
                options,
                changes,
                listening,
                _listener: listener,
                found: ReserveHistory::default(),
                reads: shared_read::SharedReads::default(),
            }),
        })
    }

    /// The connection pool (operators' queries, benchmarks).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &PgOptions {
        &self.inner.options
    }

    /// Whether the listener connection's `LISTEN` is in effect now, so that waiting duplicates
    /// are woken by other processes' changes; false while it (re)connects, and always with
    /// [`PgOptions::listen`] off.
    pub fn is_listening(&self) -> bool {
        *self.inner.listening.borrow()
    }

    /// Waits until the listener connection's `LISTEN` is in effect, at most `timeout`; returns
    /// whether it is (false at once with [`PgOptions::listen`] off). For callers (and tests) that
    /// must not miss a notification sent right after connecting.
    pub async fn wait_listening(&self, timeout: Duration) -> bool {
        if self.inner._listener.is_none() {
            return false;
        }
        let mut listening = self.inner.listening.clone();
        let on = tokio::time::timeout(timeout, listening.wait_for(|on| *on))
            .await
            .is_ok_and(|seen| seen.is_ok());
        on
    }

    /// The effective `synchronous_commit` of the pool's sessions.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when no connection can be had.
    pub async fn synchronous_commit(&self) -> Result<String> {
        let rows = self.run("SHOW synchronous_commit", &[]).await?;
        rows.first()
            .and_then(|r| r.try_get::<_, String>(0).ok())
            .ok_or_else(|| error::corrupt("SHOW synchronous_commit gave no answer"))
    }

    /// Purges completed records past their tombstone (and drops the outcomes of tombstones) every
    /// `every` until the handle is aborted or the last clone of the store is dropped. Failures
    /// are retried at the next tick.
    pub fn spawn_reaper(&self, every: Duration) -> JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let store = PgStore { inner };
                let _ = store.purge_expired().await;
            }
        })
    }

    /// Runs one statement on a pooled connection, retrying serialization failures and deadlocks.
    async fn run(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        let opts = &self.inner.options;
        let answer_within = opts.statement_timeout + opts.answer_margin;
        let mut conflicts = 0;
        loop {
            let client = self.inner.pool.get().await.map_err(error::pool)?;
            let stmt = match tokio::time::timeout(answer_within, client.prepare_cached(sql)).await {
                Ok(Ok(stmt)) => stmt,
                Ok(Err(e)) => return Err(error::before_send(e)),
                Err(_) => {
                    let _ = Object::take(client);
                    return Err(StoreError::unavailable(
                        "failed to prepare a statement in time".to_owned(),
                    ));
                }
            };
            match tokio::time::timeout(answer_within, client.query(&stmt, params)).await {
                Ok(Ok(rows)) => return Ok(rows),
                Ok(Err(e)) if conflicts < CONFLICT_RETRIES && error::is_retryable(&e) => {
                    conflicts += 1;
                }
                Ok(Err(e)) => return Err(error::after_send(e)),
                Err(_) => {
                    // The answer is still owed on this connection: never hand it out again.
                    let _ = Object::take(client);
                    return Err(StoreError::indeterminate(format!(
                        "failed to get an answer from Postgres within {answer_within:?}"
                    )));
                }
            }
        }
    }

    /// Runs a lease-carrying statement that answers with a count of rows it changed and a flag,
    /// (`columns`), and decides by `settled(changed > 0, flag)` whether the record is as wanted.
    /// A second run settles a concurrent write under the same lease that committed after the
    /// first run's snapshot; if neither settles it, the lease is lost.
    async fn settle_lease(
        &self,
        sql: &str,
        key: &Key,
        lease: Lease,
        what: &str,
        columns: (&str, &str),
        settled: impl Fn(bool, bool) -> bool,
    ) -> Result<()> {
        let token = token_bytes(lease.token);
        let fence = fence_param(lease.fence)?;
        let digest = digest_hex(key);
        for _ in 0..2 {
            let rows = self
                .run(
                    sql,
                    &[
                        &key.tenant.as_str(),
                        &key.tool.as_str(),
                        &key.key.as_str(),
                        &fence,
                        &token.as_slice(),
                        &digest,
                    ],
                )
                .await?;
            let row = rows
                .first()
                .ok_or_else(|| error::corrupt(format!("{what} gave no answer")))?;
            let changed: i64 = get(row, columns.0)?;
            let flag: bool = get(row, columns.1)?;
            if settled(changed > 0, flag) {
                return Ok(());
            }
        }
        Err(StoreError::LeaseLost)
    }
}

/// The statements every new session runs first.
fn session_setup(options: &PgOptions) -> String {
    let mut sql = format!(
        "SET statement_timeout = {};",
        duration_millis(options.statement_timeout)
    );
    if options.synchronous_commit == SyncCommit::Enforce {
        sql.push_str(
            " SELECT set_config('synchronous_commit', 'on', false) \
             WHERE current_setting('synchronous_commit') = 'off' \
             OR (current_setting('synchronous_commit') = 'local' \
                 AND current_setting('synchronous_standby_names') <> '');",
        );
    }
    sql
}

/// Checks that a commit the server acknowledges is durable, as `policy` demands.
async fn check_durability(client: &Object, policy: SyncCommit) -> Result<()> {
    let row = client
        .query_one(
            "SELECT current_setting('synchronous_commit'), \
                    current_setting('synchronous_standby_names')",
            &[],
        )
        .await
        .map_err(error::after_send)?;
    let (commit, standbys): (String, String) = (row.get(0), row.get(1));
    let lossy = commit == "off" || (commit == "local" && !standbys.is_empty());
    if lossy && policy != SyncCommit::AllowLoss {
        return Err(StoreError::misconfigured(format!(
            "Postgres has synchronous_commit = {commit}{}, so an acknowledged record may be lost \
             in a crash; set it to on, or open the store with SyncCommit::Enforce (the default) \
             or SyncCommit::AllowLoss",
            if standbys.is_empty() {
                String::new()
            } else {
                format!(" with synchronous standbys {standbys:?}")
            }
        )));
    }
    Ok(())
}

/// Refuses a primary that streams to asynchronous standbys (`sync_state = 'async'` in
/// `pg_stat_replication`): a commit does not wait for them, so a failover to one loses what the
/// store acknowledged and the standby had not received. A base backup in progress (`state =
/// 'backup'`) is no standby. A role without superuser or `pg_read_all_stats` sees NULL in
/// `sync_state` and is not refused; standbys that attach after the check are not seen.
///
/// Postgres shows a standby as `async` until it first reports how far it flushed (`flush_lsn`
/// NULL; a walreceiver reports within moments of connecting), even one that
/// `synchronous_standby_names` names: while synchronous standbys are configured, such rows are
/// looked at again for up to [`REPORT_WAIT`] before they count.
async fn check_replication(client: &Object) -> Result<()> {
    let deadline = tokio::time::Instant::now() + REPORT_WAIT;
    loop {
        let rows = client
            .query(
                "SELECT coalesce(application_name, ''), flush_lsn IS NULL \
                        AND current_setting('synchronous_standby_names') <> '' \
                 FROM pg_stat_replication \
                 WHERE sync_state = 'async' AND state IS DISTINCT FROM 'backup' \
                 ORDER BY application_name",
                &[],
            )
            .await
            .map_err(error::after_send)?;
        if rows.is_empty() {
            return Ok(());
        }
        let unreported = rows.iter().any(|r| r.get::<_, bool>(1));
        if !unreported || tokio::time::Instant::now() >= deadline {
            let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            return Err(async_replication_refused(&names));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The refusal of a primary with asynchronous standbys (`names`: their `application_name`s).
fn async_replication_refused(names: &[String]) -> StoreError {
    let n = names.len();
    let (standbys, them, it) = match n {
        1 => ("standby", "it", "it has"),
        _ => ("standbys", "them", "they have"),
    };
    StoreError::misconfigured(format!(
        "Postgres streams to {n} asynchronous {standbys} (application_name {names:?}) that a \
         commit does not wait for: a failover to {them} loses the outcomes the store acknowledged \
         and {it} not received yet, so calls that ran would run again when re-sent. Make {them} \
         synchronous (name {them} in synchronous_standby_names on the primary; the store keeps \
         synchronous_commit = on), or accept the loss by adding allow_async_replication=true to \
         the store URL (?allow_async_replication=true, or &allow_async_replication=true after \
         its other options; in Rust, PgOptions::allow_async_replication); see docs/STORES.md"
    ))
}

/// The notification payload of a record: the hex digest of its name, never the name itself.
fn digest_hex(key: &Key) -> String {
    hex(&key.digest())
}

impl PgStore {
    /// The stored row of `key` and the server's clock at the read (`get.sql`). The duplicates
    /// of a storm look at the record together (their reservations that found it standing, their
    /// looks after a notification): one read started after each of them asked answers them all
    /// (see `shared_read`).
    async fn read_row(&self, key: &Key) -> shared_read::Answer {
        self.inner
            .reads
            .read(key, || async {
                let rows = self
                    .run(
                        &self.inner.sql.get,
                        &[&key.tenant.as_str(), &key.tool.as_str(), &key.key.as_str()],
                    )
                    .await?;
                rows.first().map(|row| decode(key.clone(), row)).transpose()
            })
            .await
    }

    /// The reservation and its retries (also the absent-record arm of a takeover).
    ///
    /// Two ways, both exact, that differ only in cost. While reservations mostly find no row
    /// (every call a new action), a plain insert comes first (`insert.sql`): a fresh call is one
    /// round trip, and only a row standing is then read (`get.sql`). While they mostly find one
    /// (a retry storm), the read comes first, so a duplicate costs that read and commits
    /// nothing, and only an absent row is then inserted. A completed row past its expiry and its
    /// tombstone is renewed at the next fence (`renew.sql`, a compare-and-set). A write that
    /// finds the row changed since it was read (a racing reservation won, or the row went away)
    /// starts over.
    async fn reserve_inner(&self, r: &Reservation) -> Result<Claim> {
        let k = &r.key;
        let token = token_bytes(r.token);
        let lease_ms = duration_millis(r.lease_for);
        let (tenant, tool, key) = (k.tenant.as_str(), k.tool.as_str(), k.key.as_str());
        let fingerprint = r.fingerprint.as_bytes().as_slice();
        let scope = r.scope.as_deref();
        let params: [&(dyn ToSql + Sync); 7] = [
            &tenant,
            &tool,
            &key,
            &fingerprint,
            &token.as_slice(),
            &lease_ms,
            &scope,
        ];
        let sql = &self.inner.sql;
        // A row this reservation wrote (`insert.sql`, `renew.sql`) holds its token: the fence
        // the statement returns completes the lease.
        let acquired = |row: &Row| -> Result<Claim> {
            let fence = Fence::try_from(get::<i64>(row, "fence")?)
                .map_err(|_| error::corrupt("negative fence"))?;
            Ok(Claim::Acquired(Lease {
                fence,
                token: r.token,
            }))
        };
        for _ in 0..RACE_ATTEMPTS {
            let read_first = self.inner.found.read_first(self.inner.options.reserve_path);
            if !read_first {
                if let Some(row) = self.run(&sql.insert, &params).await?.first() {
                    self.inner.found.record(false);
                    return acquired(row);
                }
            }
            let Some((rec, now)) = self.read_row(k).await? else {
                if !read_first {
                    // The row the insert met went away since (released, or purged).
                    continue;
                }
                self.inner.found.record(false);
                match self.run(&sql.insert, &params).await?.first() {
                    Some(row) => return acquired(row),
                    None => continue,
                }
            };
            self.inner.found.record(true);
            // The core's judgement: a record that counts is the answer as it stands (ours,
            // retried after a lost answer, or another's, a tombstone among them); one past its
            // expiry and its tombstone is renewed.
            match transition::reserve(Some(&rec), r, now) {
                (claim, Change::Keep) => return Ok(claim),
                _ => match self.run(&sql.renew, &params).await?.first() {
                    Some(row) => return acquired(row),
                    None => continue,
                },
            }
        }
        Err(StoreError::unavailable(format!(
            "failed to reserve {k}: the record kept changing under concurrent writers"
        )))
    }
}

/// The conditions a listing adds to `sql/list.sql`, each starting with `AND`, and their
/// parameters (`$1` on).
struct ListQuery {
    conditions: String,
    params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl ListQuery {
    fn of(filter: &ListFilter) -> Self {
        let mut q = ListQuery {
            conditions: String::new(),
            params: Vec::new(),
        };
        if let Some(tenant) = &filter.tenant {
            q.push("r.tenant = $", tenant.as_str().to_owned());
        }
        if let Some(tool) = &filter.tool {
            q.push("r.tool = $", tool.as_str().to_owned());
        }
        if let Some(scope) = &filter.scope {
            q.push("r.scope = $", scope.to_string());
        }
        if let Some(prefix) = &filter.key_prefix {
            q.push("starts_with(r.key, $", prefix.to_string());
            q.conditions.push(')');
        }
        if let Some(from) = filter.created_from {
            q.push("r.created_at >= $", from.as_millis());
        }
        if let Some(before) = filter.created_before {
            q.push("r.created_at < $", before.as_millis());
        }
        if let Some(after) = &filter.after {
            // The listing order as a row comparison (the names byte-wise, as ORDER BY sorts
            // them): the next page starts strictly after the cursor.
            q.push(
                "(r.created_at, r.tenant COLLATE \"C\", r.tool COLLATE \"C\", r.key COLLATE \"C\") > ($",
                after.created_at.as_millis(),
            );
            for name in [
                after.key.tenant.as_str(),
                after.key.tool.as_str(),
                after.key.key.as_str(),
            ] {
                q.params.push(Box::new(name.to_owned()));
                q.conditions
                    .push_str(&format!(", ${}::text", q.params.len()));
            }
            q.conditions.push(')');
        }
        // Constants, not parameters: a partial index serves a query only when the planner can
        // prove its predicate from the query's own text (migration 7).
        let state = match filter.state {
            None => "",
            Some(State::InFlight) => "r.state = 0 AND r.lease_until > c.now",
            Some(State::Completed) => "r.state = 1 AND r.expires_at > c.now",
            Some(State::Expired) => "r.state = 1 AND r.expires_at <= c.now",
            // `State` is non-exhaustive; anything else is asked as unknown, as before.
            Some(_) => "(r.state = 2 OR (r.state = 0 AND r.lease_until <= c.now))",
        };
        if !state.is_empty() {
            q.conditions.push_str(" AND ");
            q.conditions.push_str(state);
        }
        q
    }

    /// `template` (list.sql or count.sql) with these conditions and at most `limit` rows (0: no
    /// limit), and its parameters.
    fn fill(self, template: &str, limit: usize) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
        let mut params = self.params;
        let limit = if limit > 0 {
            params.push(Box::new(i64::try_from(limit).unwrap_or(i64::MAX)));
            format!("LIMIT ${}", params.len())
        } else {
            String::new()
        };
        let sql = template
            .replace("{conditions}", &self.conditions)
            .replace("{limit}", &limit);
        (sql, params)
    }

    /// Adds `condition` followed by the number of the parameter `value` becomes.
    fn push<T: ToSql + Sync + Send + 'static>(&mut self, condition: &str, value: T) {
        self.params.push(Box::new(value));
        self.conditions
            .push_str(&format!(" AND {condition}{}", self.params.len()));
    }
}

impl Store for PgStore {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        self.reserve_inner(r).await
    }

    async fn takeover(&self, r: &Reservation, stale: Fence) -> Result<Claim> {
        let k = &r.key;
        let Ok(stale_param) = i64::try_from(stale) else {
            // No row has such a fence: look at what stands.
            return match self.get(k).await? {
                Some(view) => Ok(Claim::Existing(view)),
                None => self.reserve_inner(r).await,
            };
        };
        let token = token_bytes(r.token);
        let rows = self
            .run(
                &self.inner.sql.takeover,
                &[
                    &k.tenant.as_str(),
                    &k.tool.as_str(),
                    &k.key.as_str(),
                    &r.fingerprint.as_bytes().as_slice(),
                    &token.as_slice(),
                    &duration_millis(r.lease_for),
                    &stale_param,
                    &digest_hex(k),
                ],
            )
            .await?;
        let Some(row) = rows.first() else {
            // Absent: reserve as by `reserve`.
            return self.reserve_inner(r).await;
        };
        let written: bool = get(row, "written")?;
        let (rec, now) = decode(k.clone(), row)?;
        if written {
            return Ok(Claim::Acquired(lease_of(&rec)));
        }
        match rec.view(now) {
            // Completed, past its expiry and its tombstone: as absent.
            None => self.reserve_inner(r).await,
            Some(_)
                if rec.token == r.token && matches!(rec.state, RecordState::InFlight { .. }) =>
            {
                // Our own takeover, retried after a lost answer.
                Ok(Claim::Acquired(lease_of(&rec)))
            }
            Some(view) => Ok(Claim::Existing(view)),
        }
    }

    async fn heartbeat(&self, key: &Key, lease: Lease, lease_for: Duration) -> Result<Timestamp> {
        let token = token_bytes(lease.token);
        let rows = self
            .run(
                &self.inner.sql.heartbeat,
                &[
                    &key.tenant.as_str(),
                    &key.tool.as_str(),
                    &key.key.as_str(),
                    &fence_param(lease.fence)?,
                    &token.as_slice(),
                    &duration_millis(lease_for),
                ],
            )
            .await?;
        match rows.first() {
            Some(row) => Ok(Timestamp::from_millis(get(row, "lease_until")?)),
            None => Err(StoreError::LeaseLost),
        }
    }

    async fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>,
    ) -> Result<Completion> {
        let token = token_bytes(lease.token);
        let fence = fence_param(lease.fence)?;
        let kind = outcome_kind_code(outcome.kind);
        let digest = digest_hex(key);
        let (tenant, tool, name) = (key.tenant.as_str(), key.tool.as_str(), key.key.as_str());
        let rows = self
            .run(
                &self.inner.sql.complete,
                &[
                    &tenant,
                    &tool,
                    &name,
                    &fence,
                    &token.as_slice(),
                    &duration_millis(keep.ttl),
                    &kind,
                    &outcome.body.as_slice(),
                    &digest,
                    &executed_at.map(Timestamp::as_millis),
                    &duration_millis(keep.tombstone),
                ],
            )
            .await?;
        let rows = match rows.is_empty() {
            false => rows,
            // Not updated: completed under this lease already (the first completion stands and
            // is the answer, a tombstone's too), or the lease is lost.
            true => {
                let lease = [
                    &tenant as _,
                    &tool as _,
                    &name as _,
                    &fence as _,
                    &token.as_slice() as _,
                ];
                self.run(&self.inner.sql.completed, &lease).await?
            }
        };
        let row = rows.first().ok_or(StoreError::LeaseLost)?;
        Ok(Completion {
            completed_at: Timestamp::from_millis(get(row, "completed_at")?),
            expires_at: Timestamp::from_millis(get(row, "expires_at")?),
        })
    }

    async fn release(&self, key: &Key, lease: Lease) -> Result<()> {
        let sql = &self.inner.sql.release;
        self.settle_lease(
            sql,
            key,
            lease,
            "release",
            ("deleted", "present"),
            |done, present| done || !present,
        )
        .await
    }

    async fn mark_unknown(&self, key: &Key, lease: Lease) -> Result<()> {
        let sql = &self.inner.sql.mark_unknown;
        self.settle_lease(
            sql,
            key,
            lease,
            "mark unknown",
            ("updated", "already"),
            |done, already| done || already,
        )
        .await
    }

    async fn reopen(&self, key: &Key, fence: Fence) -> Result<Reopened> {
        // A fence beyond `bigint` is no row's.
        if let Ok(fence) = i64::try_from(fence) {
            let rows = self
                .run(
                    &self.inner.sql.reopen,
                    &[
                        &key.tenant.as_str(),
                        &key.tool.as_str(),
                        &key.key.as_str(),
                        &fence,
                        &digest_hex(key),
                    ],
                )
                .await?;
            if !rows.is_empty() {
                return Ok(Reopened::Expired);
            }
        }
        Ok(Reopened::Kept(self.get(key).await?))
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        Ok(self
            .read_row(key)
            .await?
            .and_then(|(rec, now)| rec.view(now)))
    }

    async fn append_history(&self, key: &Key, entry: &HistoryEntry) -> Result<bool> {
        let line = entry.to_line() + "\n";
        let rows = self
            .run(
                &self.inner.sql.append_history,
                &[
                    &key.tenant.as_str(),
                    &key.tool.as_str(),
                    &key.key.as_str(),
                    &line,
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn history(&self, key: &Key) -> Result<Vec<HistoryEntry>> {
        let rows = self
            .run(
                &self.inner.sql.history,
                &[&key.tenant.as_str(), &key.tool.as_str(), &key.key.as_str()],
            )
            .await?;
        let unreadable = |e: &dyn std::fmt::Display| {
            StoreError::corrupt(format!("the history of record {key} is unreadable: {e}"))
        };
        let text: Option<String> = match rows.first() {
            Some(row) => row.try_get(0).map_err(|e| unreadable(&e))?,
            None => None,
        };
        HistoryEntry::from_lines(text.as_deref().unwrap_or("")).map_err(|e| unreadable(&e))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let (sql, params) = ListQuery::of(filter).fill(&self.inner.sql.list, filter.limit);
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| &**p as _).collect();
        let rows = self.run(&sql, &refs).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let (rec, now) = decode(key_of(row)?, row)?;
            if let Some(view) = rec.view(now) {
                out.push(view);
            }
        }
        Ok(out)
    }

    async fn count(&self, filter: &ListFilter, at_most: usize) -> Result<usize> {
        if at_most == 0 {
            return Ok(0);
        }
        let (sql, params) = ListQuery::of(&filter.whole()).fill(&self.inner.sql.count, at_most);
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| &**p as _).collect();
        let rows = self.run(&sql, &refs).await?;
        let n: i64 = match rows.first() {
            Some(row) => get(row, "n")?,
            None => 0,
        };
        Ok(usize::try_from(n).unwrap_or(0))
    }

    async fn purge_expired(&self) -> Result<u64> {
        let rows = self.run(&self.inner.sql.purge, &[]).await?;
        let n: i64 = match rows.first() {
            Some(row) => get(row, "purged")?,
            None => 0,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn wait_changed(&self, key: &Key, _since: ChangeMark, timeout: Duration) {
        // No mark is needed: the wait query below looks at the record again, atomically with
        // flagging it, after the subscription is taken. A settling since the caller's look is
        // seen there; a later one is notified.
        if self.inner._listener.is_none() {
            tokio::time::sleep(timeout.min(idemgate_core::store::DEFAULT_POLL)).await;
            return;
        }
        let digest = digest_hex(key);
        // Subscribed before the row is flagged: a notification sent once the flag is committed
        // cannot be missed.
        let mut rx = self.inner.changes.subscribe();
        // Flag the row as waited for, so that the write that settles it notifies (writes nobody
        // waits for do not). A row that settled meanwhile needs no wait; a store that cannot be
        // reached leaves the wait to the timeout.
        let watched = self
            .run(
                &self.inner.sql.wait,
                &[&key.tenant.as_str(), &key.tool.as_str(), &key.key.as_str()],
            )
            .await
            .map(|rows| rows.first().is_some_and(|r| r.get::<_, bool>("watched")));
        if matches!(watched, Ok(false)) {
            return;
        }
        let _ = tokio::time::timeout(timeout, async {
            loop {
                match rx.recv().await {
                    Ok(d) if *d == *digest || &*d == wake::WAKE_ALL => return,
                    Ok(_) => {}
                    // Too many notifications to keep up with: look again rather than miss ours.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        })
        .await;
    }
}
