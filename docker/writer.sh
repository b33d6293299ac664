#!/usr/bin/env bash
# docker/writer.sh — the compose stack's event writer: a service that writes outbox rows the
# way the seed's services do (InTx { repo.CreateTx; outboxPub.PublishTx }), one transaction
# every WRITER_INTERVAL_MS with one to three events of one review.
#
# Rows are in the seed's format: uuid a ULID (26 characters), payload the event body, and
# metadata the envelope as Go's json.Marshal(map[string]string) writes it (keys sorted, no
# spaces): Aggregate-Id, Correlation-Id, Event-Type, Published-At, Schema-Version,
# Source-Service. The relay maps them to topic kazmaps.review.review, key review-<id>.
#
# Runs in the postgres:15 image (psql); connection from the libpq variables PGHOST, PGUSER,
# PGPASSWORD, PGDATABASE. One psql session reads the statements from the loop, so a
# transaction costs one round trip per statement, not a new connection.
set -euo pipefail

INTERVAL_MS=${WRITER_INTERVAL_MS:-200}
REVIEWS=${WRITER_REVIEWS:-50}

until pg_isready -q; do sleep 1; done
echo "writer: one transaction every ${INTERVAL_MS} ms into ${PGDATABASE}.outbox on ${PGHOST}" >&2

sleep_s=$(printf '%d.%03d' $((INTERVAL_MS / 1000)) $((INTERVAL_MS % 1000)))

statements() {
  # A ULID: 48-bit millisecond time then 80 random bits, Crockford base32, 26 characters.
  cat <<'SQL'
CREATE FUNCTION pg_temp.ulid() RETURNS text LANGUAGE sql VOLATILE AS $$
  SELECT string_agg(substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ',
           1 + (CASE WHEN i < 10 THEN (ms >> (5 * (9 - i))) & 31
                     ELSE floor(random() * 32)::bigint END)::int, 1), '' ORDER BY i)
    FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) AS now_ms,
         generate_series(0, 25) AS i
$$;
CREATE FUNCTION pg_temp.event(review bigint, event_type text, correlation text, body text)
RETURNS void LANGUAGE sql VOLATILE AS $$
  INSERT INTO outbox (uuid, payload, metadata)
  VALUES (pg_temp.ulid(), body::json,
          format('{"Aggregate-Id":%s,"Correlation-Id":%s,"Event-Type":%s,"Published-At":%s,'
                 '"Schema-Version":"1","Source-Service":"review"}',
                 to_json('review-' || review), to_json(correlation), to_json(event_type),
                 to_json(to_char(clock_timestamp() AT TIME ZONE 'UTC',
                                 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')))::json)
$$;
SQL
  declare -A version=()
  while true; do
    local review=$((RANDOM % REVIEWS + 1)) events=$((RANDOM % 3 + 1)) i v type body
    local correlation
    correlation=$(cat /proc/sys/kernel/random/uuid)
    echo "BEGIN;"
    for ((i = 0; i < events; i++)); do
      v=$((${version[$review]:-0} + 1))
      version[$review]=$v
      if ((v == 1)); then
        type=review.created
        body=$(printf '{"review_id":%d,"version":%d,"rating":%d,"text":"Great place"}' \
          "$review" "$v" $((RANDOM % 5 + 1)))
      else
        type=review.updated
        body=$(printf '{"review_id":%d,"version":%d,"rating":%d}' "$review" "$v" $((RANDOM % 5 + 1)))
      fi
      echo "SELECT pg_temp.event($review, '$type', '$correlation', '$body');"
    done
    echo "COMMIT;"
    sleep "$sleep_s"
  done
}

statements | psql -X -q -v ON_ERROR_STOP=1 -o /dev/null
