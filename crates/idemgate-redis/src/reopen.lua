-- Reopen: a completed record at the fence that still counts expires now, so that it counts as
-- absent and the next reservation takes the next fence. Mirrors
-- idemgate_core::transition::reopen. KEYS[1] record; ARGV fence, grace_ms.
-- Returns {'R'} when reopened, {'K', now, flat record} otherwise.
local k = KEYS[1]
local now = now_ms()
local r, flat = load(k)
if r ~= nil and counts(r, now) and r.state == 'c' and r.fence == ARGV[1] then
  wake(k, r)
  redis.call('HSET', k, 'expires_at', fmt(now))
  -- As after any expiry, Redis reaps it a grace period later; until then it keeps the fence.
  redis.call('PEXPIREAT', k, fmt(now + tonumber(ARGV[2])))
  return {'R'}
end
return {'K', fmt(now), flat}
