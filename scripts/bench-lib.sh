# Sourced by the benchmarks (scripts/bench-python, scripts/bench-node, scripts/bench-mcp).
#
# Throwaway PostgreSQL and Redis servers of one run, so that every library is timed against a
# store at the same durability and none touches the shared servers. Each listens on a free
# loopback port, keeps its files in a directory of its own under /tmp, and is stopped at the end
# by the pid this run recorded (only while that pid is still the server). The sourcing script
# calls `bench_stop` on exit (it sets the trap itself, since a script has one EXIT trap), which
# also stops the busy processes of `busy_load`.
#
#   private_redis: redis-server with its append-only file fsynced every second (the durability
#     idemgate asks of Redis); exports IDEMGATE_TEST_REDIS_URL.
#   private_postgres: a cluster from initdb with fsync and synchronous commit on; exports
#     IDEMGATE_TEST_POSTGRES_URL.
#   busy_load N: N processes that each spin a core for the whole run (a loaded machine anyone can
#     reproduce); exports BENCH_LOAD=N for the bench's header.
#   one_core: what starts from then on (private_redis, and the bench itself run under
#     "${PINNED[@]}") runs on the first core only; exports BENCH_ONE_CORE=1 for the header.
#   bench_header: one line saying when, on how many cores and at what load average.

PRIVATE_STOPS=()
bench_stop() { for stop in "${PRIVATE_STOPS[@]}"; do "$stop"; done; }

bench_header() {
  local load; read -r load _ < /proc/loadavg
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $load${BENCH_LOAD:+, $BENCH_LOAD busy processes beside}"
}

PINNED=()
one_core() {
  PINNED=(taskset -c 0)
  export BENCH_ONE_CORE=1
}

BUSY_PIDS=()
busy_load() {
  local n="$1"
  for _ in $(seq 1 "$n"); do
    bash -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &
    BUSY_PIDS+=("$!")
  done
  if [ "$n" -gt 0 ]; then
    PRIVATE_STOPS+=(busy_stop)
    export BENCH_LOAD="$n"
  fi
}

busy_stop() {
  # Only the spinners this run started, by their recorded pids, while they are still ours.
  for pid in "${BUSY_PIDS[@]}"; do
    if [ "$pid" -gt 0 ] && [ "$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$$" ]; then
      kill -TERM "$pid"
    fi
  done
}

private_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits until `$@` succeeds (a readiness probe), at most 30 s; fails with the server's log.
private_await() {
  local log="$1" what="$2"; shift 2
  for _ in $(seq 1 300); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  cat "$log" >&2
  echo "private $what did not start" >&2
  exit 1
}

private_redis() {
  PRIVATE_REDIS_DIR="$(mktemp -d /tmp/idemgate-bench-redis.XXXXXX)"
  local port; port="$(private_free_port)"
  # taskset execs the server: the pid recorded below is the server's.
  "${PINNED[@]}" redis-server --port "$port" --bind 127.0.0.1 --dir "$PRIVATE_REDIS_DIR" --save "" \
    --appendonly yes --appendfsync everysec --daemonize no --logfile "$PRIVATE_REDIS_DIR/log" \
    </dev/null >/dev/null 2>&1 &
  PRIVATE_REDIS_PID=$!
  PRIVATE_STOPS+=(private_redis_stop)
  private_await "$PRIVATE_REDIS_DIR/log" redis redis-cli -p "$port" ping
  export IDEMGATE_TEST_REDIS_URL="redis://127.0.0.1:$port"
}

private_redis_stop() {
  # Only the server this run started, by the pid it recorded, and only while it is still one.
  if [ "$PRIVATE_REDIS_PID" -gt 0 ] && kill -0 "$PRIVATE_REDIS_PID" 2>/dev/null \
    && grep -q redis-server "/proc/$PRIVATE_REDIS_PID/cmdline" 2>/dev/null; then
    kill -TERM "$PRIVATE_REDIS_PID"
    for _ in $(seq 1 100); do kill -0 "$PRIVATE_REDIS_PID" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$PRIVATE_REDIS_DIR"
}

private_postgres() {
  local bin; bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
  PRIVATE_PG_DIR="$(mktemp -d /tmp/idemgate-bench-pg.XXXXXX)"
  local port; port="$(private_free_port)"
  chown -R postgres: "$PRIVATE_PG_DIR"
  runuser -u postgres -- "$bin/initdb" -U postgres --auth=trust -E UTF8 --no-sync \
    -D "$PRIVATE_PG_DIR/data" >"$PRIVATE_PG_DIR/initdb.log"
  runuser -u postgres -- "$bin/postgres" -D "$PRIVATE_PG_DIR/data" -p "$port" \
    -c listen_addresses=127.0.0.1 -c unix_socket_directories="$PRIVATE_PG_DIR" -c fsync=on \
    -c synchronous_commit=on -c max_connections=80 >"$PRIVATE_PG_DIR/log" 2>&1 </dev/null &
  PRIVATE_STOPS+=(private_postgres_stop)
  private_await "$PRIVATE_PG_DIR/log" postgres pg_isready -q -h 127.0.0.1 -p "$port"
  export IDEMGATE_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"
}

private_postgres_stop() {
  # The postmaster's own pid, as it recorded it; only that process is signalled.
  local pid; pid="$(head -1 "$PRIVATE_PG_DIR/data/postmaster.pid" 2>/dev/null || true)"
  if [ -n "$pid" ] && [ "$pid" -gt 0 ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$PRIVATE_PG_DIR"
}
