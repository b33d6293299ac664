CREATE TABLE IF NOT EXISTS outbox (
    offset_acked     BIGINT,
    offset_consumed  BIGSERIAL NOT NULL,
    uuid             VARCHAR(36) NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    payload          JSON,
    metadata         JSON,
    transaction_id   xid8 NOT NULL DEFAULT pg_current_xact_id(),
    CONSTRAINT outbox_pk PRIMARY KEY (transaction_id, offset_consumed)
);
CREATE INDEX IF NOT EXISTS idx_outbox_acked ON outbox (offset_acked) WHERE offset_acked IS NULL;
