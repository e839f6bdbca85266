-- Get: the record and the server time, read together. KEYS[1] record. Returns {now, flat record}.
local now = now_ms()
local _, flat = load(KEYS[1])
return {fmt(now), flat}
