-- Reopen: a completed record at the fence that still counts (replayed, or a tombstone) expires
-- now, tombstone and all, so that it counts as absent and the next reservation takes the next
-- fence. Mirrors idemgate_core::transition::reopen. KEYS[1] record; ARGV fence, grace_ms.
-- Returns {'R'} when reopened, {'K', now, flat record} otherwise.
local k = KEYS[1]
local now = now_ms()
local r, flat = load(k)
if r ~= nil and counts(r, now) and r.state == 'c' and r.fence == ARGV[1] then
  wake(k, r)
  -- A tombstone keeps its (earlier) expiry: it says when its outcome stopped being replayed.
  redis.call('HSET', k, 'expires_at', fmt(math.min(tonumber(r.expires_at), now)),
    'retain_until', fmt(now))
  -- As after any expiry, Redis reaps it a grace period later; until then it keeps the fence.
  redis.call('PEXPIREAT', k, fmt(now + tonumber(ARGV[2])))
  return {'R'}
end
return {'K', fmt(now), flat}
