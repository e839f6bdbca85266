-- A record's history, one JSON object per line ($1 tenant, $2 tool, $3 key). No row, or NULL: none.
SELECT history FROM {schema}.idemgate_records WHERE tenant = $1 AND tool = $2 AND key = $3
