-- How many rows a listing's filter selects (`{conditions}`, as in list.sql), counted up to the
-- LIMIT of `{limit}`, which stops the scan there: a count over a large table stays bounded.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
)
SELECT count(*) AS n FROM (
    SELECT 1
    FROM {schema}.idemgate_records r, clock c
    WHERE NOT (r.state = 1 AND GREATEST(r.expires_at, r.retain_until) <= c.now)
      {conditions}
    {limit}
) counted
