-- Purge one record. Mirrors idemgate_core::transition::purge: a completed record past its
-- tombstone is deleted; one past its expiry whose tombstone stays loses its outcome's body
-- (nothing reads it any more, and a tombstone should cost its name and a few numbers, not a
-- result). Checked again here, atomically, so a record reserved anew since the caller looked is
-- never touched. KEYS[1] record. Returns 1 when it deleted the record, else 0.
local k = KEYS[1]
local now = now_ms()
local st = redis.call('HMGET', k, 'state', 'expires_at', 'retain_until')
if st[1] ~= 'c' then
  return 0
end
-- A record written before tombstones has no retain_until: it kept none.
if tonumber(st[3] or st[2]) <= now then
  redis.call('DEL', k)
  return 1
end
if tonumber(st[2]) <= now then
  redis.call('HDEL', k, 'body')
end
return 0
