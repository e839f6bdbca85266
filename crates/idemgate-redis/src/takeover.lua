-- Takeover of an unknown record. Mirrors idemgate_core::transition::takeover.
-- KEYS[1] record; ARGV tenant, tool, key, fingerprint, token, lease_ms, stale fence, scope (see
-- scope_arg; only for an absent record, which is reserved: a takeover keeps the record's scope).
-- Returns {'A', fence} when acquired, {'E', now, flat record} otherwise.
local k = KEYS[1]
local stale = ARGV[7]
local now = now_ms()
local r, flat = load(k)
if r == nil or not counts(r, now) then
  local fence = 1
  if r ~= nil then
    fence = tonumber(r.fence) + 1
  end
  put_fresh(k, r ~= nil, fence, now, now, scope_arg(ARGV[8]), r and r.history)
  return {'A', fmt(fence)}
end
if r.token == ARGV[5] and r.state == 'i' then
  -- Our own takeover, retried after a lost answer.
  return {'A', r.fence}
end
if reads_unknown(r, now) and r.fence == stale and r.fp == ARGV[4] then
  local fence = tonumber(stale) + 1
  -- Duplicates that waited for the lapsed lease look again, and find the new holder.
  wake(k, r)
  put_fresh(k, true, fence, tonumber(r.created), now, r.scope, r.history)
  return {'A', fmt(fence)}
end
return {'E', fmt(now), flat}
