-- bench/sql/setup.sql — the benchmark's table and row generators (applied by bench/harness.py).
-- The table is the seed's (sql/outbox.sql); autovacuum is off for it so that a vacuum starting
-- in the middle of one contender's drain does not make the runs incomparable (the harness
-- truncates the table between backlogs instead).
\ir ../../sql/outbox.sql
ALTER TABLE outbox SET (autovacuum_enabled = off);

-- ~250-byte payload, like a review service's event body.
CREATE OR REPLACE FUNCTION bench_payload(n bigint) RETURNS json
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT format(
    '{"review_id":"%s","place_id":"01HQZX2M1N0P9Q8R7S6T5U4V3W","author_id":"01HQZX1A2B3C4D5E6F7G8H9J0K",'
    '"rating":%s,"text":"Great coffee, friendly staff, will come back","created_at":"2024-03-01T12:00:00.123456Z","visible":true}',
    upper(substr(md5(n::text), 1, 26)), 1 + n % 5)::json
$$;

-- ~300-byte metadata exactly as Go's json.Marshal(map[string]string) writes it: sorted keys,
-- the seven envelope keys. 10,000 aggregates (keys spread over the partitions); created and
-- updated events of the same aggregate share the topic (template {Event-Type:aggregate}).
CREATE OR REPLACE FUNCTION bench_metadata(n bigint) RETURNS json
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT format(
    '{"Aggregate-Id":"review-%s","Correlation-Id":"%s","Event-Type":"%s",'
    '"Published-At":"2024-03-01T12:00:00.123456Z","Schema-Version":"1","Source-Service":"review-service",'
    '"traceparent":"00-%s-%s-01"}',
    lpad((n % 10000)::text, 12, '0'),
    (md5('c' || n)::uuid)::text,
    CASE WHEN n % 4 = 0 THEN 'review.created' ELSE 'review.updated' END,
    md5('t' || n), substr(md5('s' || n), 1, 16))::json
$$;

-- bench/harness.py --row small: the same table with small rows (a ~20-byte payload, two
-- metadata keys), to show how the drain ratios move with row size (bench/README.md).
CREATE OR REPLACE FUNCTION bench_payload_small(n bigint) RETURNS json
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT format('{"review_id":%s}', n)::json
$$;

CREATE OR REPLACE FUNCTION bench_metadata_small(n bigint) RETURNS json
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT format('{"Aggregate-Id":"review-%s","Event-Type":"%s"}', n % 10000,
    CASE WHEN n % 4 = 0 THEN 'review.created' ELSE 'review.updated' END)::json
$$;
