-- Append to a record's history (one JSON object per line, idemgate_core::history), whatever its
-- state. KEYS[1] record; ARGV[1] the line, newline included. Returns 1 when a record was there to
-- take it, else 0. The field rides with the record: put_fresh keeps it, and it goes when the key
-- does (a purge, or Redis expiring the key after its tombstone).
local k = KEYS[1]
if redis.call('EXISTS', k) == 0 then
  return 0
end
redis.call('HSET', k, 'history', (redis.call('HGET', k, 'history') or '') .. ARGV[1])
return 1
