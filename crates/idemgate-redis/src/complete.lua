-- Complete: store the outcome under the holder's lease. Mirrors idemgate_core::transition::complete.
-- KEYS[1] record; ARGV fence, token, kind, body, ttl_ms, retain_ms (how long the record counts:
-- the longer of ttl and tombstone, see idemgate_core::Keep), grace_ms, executed_at_ms ('' for
-- now). Returns {completed_at, expires_at}: the first completion's when it is already completed,
-- also once it is a tombstone.
local k = KEYS[1]
-- Only the fields a completion reads: cheaper than the whole record (`load`), whose outcome and
-- history it never needs. A missing key reads as all false, which holds no lease.
local f = redis.call('HMGET', k, 'fence', 'token', 'state', 'completed_at', 'expires_at', 'waiters')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] then
  return lease_lost()
end
if f[3] == 'c' then
  return {f[4], f[5]}
end
local now = now_ms()
local expires_at = now + tonumber(ARGV[5])
local retain_until = now + tonumber(ARGV[6])
local completed_at = now
if ARGV[8] ~= '' then
  completed_at = math.min(now, tonumber(ARGV[8]))
end
wake(k, {waiters = f[6]})
redis.call('HDEL', k, 'lease_until', 'since')
redis.call('HSET', k, 'state', 'c', 'kind', ARGV[3], 'body', ARGV[4],
  'completed_at', fmt(completed_at), 'expires_at', fmt(expires_at),
  'retain_until', fmt(retain_until))
-- Redis reaps the record itself a grace period after it stops counting (its tombstone's end, not
-- its expiry: the tombstone must outlive the outcome); until then it keeps the fence for the next
-- reservation and answers a late retry of this completion.
redis.call('PEXPIREAT', k, fmt(retain_until + tonumber(ARGV[7])))
return {fmt(completed_at), fmt(expires_at)}
