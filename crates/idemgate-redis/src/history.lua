-- A record's history: KEYS[1] record. Returns the text (one JSON object per line), or nil.
return redis.call('HGET', KEYS[1], 'history')
