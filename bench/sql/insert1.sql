-- bench/sql/insert1.sql — pgbench script of the live load: one outbox row per transaction,
-- as a service's InTx { repo.CreateTx; outboxPub.PublishTx } writes it.
\set n random(1, 1000000000)
INSERT INTO outbox (uuid, payload, metadata) VALUES (gen_random_uuid()::text, bench_payload(:n), bench_metadata(:n));
