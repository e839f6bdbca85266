-- Release: delete the record held under the lease. Mirrors idemgate_core::transition::release.
-- KEYS[1] record; ARGV fence, token. An absent record is released already.
local k = KEYS[1]
local r = load(k)
if r == nil then
  return 1
end
if holds(r, ARGV[1], ARGV[2]) and r.state ~= 'c' then
  wake(k, r)
  redis.call('DEL', k)
  return 1
end
return lease_lost()
