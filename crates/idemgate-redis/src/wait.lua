-- Wait: a duplicate is about to wait for the record to settle. KEYS[1] record. Flags the record
-- as waited for and returns 1 while it is in flight with a live lease, so that the write that
-- settles it publishes its name (see wake in common.lua); returns 0 when there is nothing to
-- wait for (settled, absent, or its lease ran out), and then flags nothing.
local k = KEYS[1]
local now = now_ms()
local r = load(k)
if r == nil or r.state ~= 'i' or tonumber(r.lease_until) <= now then
  return 0
end
redis.call('HSET', k, 'waiters', '1')
return 1
