-- Mark unknown: the tool reported an ambiguous outcome. Mirrors
-- idemgate_core::transition::mark_unknown. KEYS[1] record; ARGV fence, token.
local k = KEYS[1]
local now = now_ms()
local r = load(k)
if holds(r, ARGV[1], ARGV[2]) then
  if r.state == 'i' then
    wake(k, r)
    redis.call('HDEL', k, 'lease_until')
    redis.call('HSET', k, 'state', 'u', 'since', fmt(now))
    return 1
  elseif r.state == 'u' then
    return 1
  end
end
return lease_lost()
