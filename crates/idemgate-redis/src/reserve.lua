-- Reserve: insert an in-flight record unless one counts. Mirrors idemgate_core::transition::reserve.
-- KEYS[1] record; ARGV tenant, tool, key, fingerprint, token, lease_ms, scope (see scope_arg).
-- Returns {'A', fence} when acquired, {'E', now, flat record} when another record stands.
local k = KEYS[1]
local now = now_ms()
local r, flat = load(k)
if r ~= nil and counts(r, now) then
  if r.token == ARGV[5] and r.state == 'i' then
    -- Our own reservation, retried after a lost answer.
    return {'A', r.fence}
  end
  return {'E', fmt(now), flat}
end
-- A record replaced after expiry keeps counting its fence up, so fences only grow.
local fence = 1
if r ~= nil then
  fence = tonumber(r.fence) + 1
end
put_fresh(k, r ~= nil, fence, now, now, scope_arg(ARGV[7]), r and r.history)
return {'A', fmt(fence)}
