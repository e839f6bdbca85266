-- Heartbeat: extend the lease of an in-flight record. Mirrors idemgate_core::transition::heartbeat.
-- KEYS[1] record; ARGV fence, token, lease_ms. Returns the new end of the lease.
local k = KEYS[1]
local now = now_ms()
local r = load(k)
if holds(r, ARGV[1], ARGV[2]) and r.state == 'i' then
  local lease_until = fmt(now + tonumber(ARGV[3]))
  redis.call('HSET', k, 'lease_until', lease_until)
  return lease_until
end
return lease_lost()
