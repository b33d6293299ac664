-- docker/compose.yml: runs after 10-outbox.sql (sql/outbox.sql, the seed's table) in the
-- review database, once, when the data volume is empty.
--
-- The relay connects as a role of its own with the least it needs, as in production:
--   REPLICATION             open a logical replication connection, create its slot
--   SELECT                  snapshot backfill and replay read the table
--   UPDATE                  marking: offset_acked = offset_consumed
--   DELETE                  `outbox-relay cleanup` (the seed's CronJob) deletes acked rows
--   CREATE on the database  the relay creates its schema outbox_relay (commit index, state)
--                           with CREATE SCHEMA IF NOT EXISTS, which PostgreSQL refuses without
--                           this privilege even when the schema already exists
-- The publication is created here by the table's owner: CREATE PUBLICATION ... FOR TABLE
-- needs ownership of the table, which the relay's role does not have. Publishing inserts
-- only keeps the marking UPDATEs out of the stream.
CREATE ROLE relay LOGIN REPLICATION PASSWORD 'relay';
GRANT SELECT, UPDATE, DELETE ON outbox TO relay;
DO $$
BEGIN
    EXECUTE format('GRANT CREATE ON DATABASE %I TO relay', current_database());
END
$$;
CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert');
