-- Append one line to a record's history, whatever its state. $1 tenant, $2 tool, $3 key, $4 the
-- line (a JSON object and a newline). No row: no record is stored under the key.
UPDATE {schema}.idemgate_records SET history = coalesce(history, '') || $4::text
WHERE tenant = $1 AND tool = $2 AND key = $3
RETURNING 1
