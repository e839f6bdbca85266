-- Purge one record if it is completed and past its expiry (checked again here, atomically, so a
-- record reserved anew since the caller looked is never deleted). KEYS[1] record. Returns 1 or 0.
local k = KEYS[1]
local now = now_ms()
local st = redis.call('HMGET', k, 'state', 'expires_at')
if st[1] == 'c' and tonumber(st[2]) <= now then
  redis.call('DEL', k)
  return 1
end
return 0
