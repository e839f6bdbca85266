-- Shared by every idemgate script (prepended to each). A record is one hash:
--   tenant, tool, key, fp, fence, token, created, state ('i' in flight, 'c' completed, 'u' unknown)
--   scope: where the reserving call was made (absent when it named none)
--   'i': lease_until        'u': since
--   'c': kind, body, completed_at, expires_at, retain_until
--        The outcome is replayed until expires_at; from then until retain_until the record is a
--        tombstone (reported expired, with no outcome; it still counts, so a retry is refused
--        instead of running again), then it counts as absent. retain_until is absent in records
--        written before tombstones: it is then expires_at. Purging drops the body of a tombstone
--        (nothing reads it any more), so an absent body is an empty one.
--        The key's Redis expiry is retain_until plus the store's grace (see complete.lua).
--   waiters: '1' while a duplicate waits for the in-flight record to settle (set by wait.lua)
--   history: what happened to the record that its state does not say, one JSON object per line
--        (append_history.lua); absent for nearly every record. Kept across put_fresh.
-- Times are milliseconds since the epoch by the server's clock (TIME), never the client's.
-- Numbers are written with string.format('%d') so that large values never turn into '1.8e+12'.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%d', n)
end

-- The record as a table (nil when absent) and as the flat HGETALL array.
local function load(k)
  local flat = redis.call('HGETALL', k)
  if #flat == 0 then
    return nil, flat
  end
  local r = {}
  for i = 1, #flat, 2 do
    r[flat[i]] = flat[i + 1]
  end
  return r, flat
end

-- Until when a completed record counts: the end of its tombstone, or its expiry for a record
-- written before tombstones (which kept none).
local function retained_until(r)
  return tonumber(r.retain_until or r.expires_at)
end

-- Whether the record counts at now: a completed record past its tombstone is as if absent (one
-- past its expiry but not its tombstone still counts, as expired).
local function counts(r, now)
  return not (r.state == 'c' and retained_until(r) <= now)
end

-- Whether the lease (fence, token) is the record's current one.
local function holds(r, fence, token)
  return r ~= nil and r.fence == fence and r.token == token
end

-- Whether the record reads as unknown at now: marked so, or its lease ran out.
local function reads_unknown(r, now)
  return r.state == 'u' or (r.state == 'i' and tonumber(r.lease_until) <= now)
end

-- Replaces whatever the key held (fields and expiry) with a fresh in-flight record from the
-- reservation in ARGV[1..6]: tenant, tool, key, fingerprint, token, lease in ms; `replaces`:
-- whether a record stood there (`load` found one; with none there is nothing to delete, and a
-- fresh key costs no DEL); `scope` is the record's scope (nil: none); `history` the history of
-- the record it replaces, as `load` read it (nil: none), which continues across a takeover and
-- the next reservation of a reopened key.
local function put_fresh(k, replaces, fence, created, now, scope, history)
  if replaces then
    redis.call('DEL', k)
  end
  redis.call('HSET', k,
    'tenant', ARGV[1], 'tool', ARGV[2], 'key', ARGV[3], 'fp', ARGV[4],
    'fence', fmt(fence), 'token', ARGV[5], 'created', fmt(created),
    'state', 'i', 'lease_until', fmt(now + tonumber(ARGV[6])))
  if scope ~= nil then
    redis.call('HSET', k, 'scope', scope)
  end
  if history then
    redis.call('HSET', k, 'history', history)
  end
end

-- The scope a reservation sends: '' for none, else '=' and the scope (so that an empty scope is
-- still one).
local function scope_arg(arg)
  if arg == nil or arg == '' then
    return nil
  end
  return string.sub(arg, 2)
end

local function lease_lost()
  return redis.error_reply('LEASE_LOST the caller no longer holds the record')
end

-- The channel on which settling a record that duplicates wait for names it (the store's
-- subscriber wakes them). Shared by every key prefix: the payload is the record's full name.
local CHANGED = 'idemgate:changed'

-- Tells the record's waiters, if it has any, that it settled, and forgets them: a record nobody
-- waits for costs no PUBLISH (on a cluster, one goes to every node).
local function wake(k, r)
  if r ~= nil and r.waiters then
    redis.call('HDEL', k, 'waiters')
    redis.call('PUBLISH', CHANGED, k)
  end
end
