-- Schema 8 on PostgreSQL (migrations/0008_leadership.sql): the leadership
-- lease of standby controllers (rc.controller.store.leader). expires_at is
-- judged by the database's clock only (clock_timestamp()), never a
-- controller's.

CREATE TABLE leadership (
    id         bigint PRIMARY KEY CHECK (id = 1),
    holder     text NOT NULL,
    url        text NOT NULL,
    epoch      bigint NOT NULL CHECK (epoch >= 0),
    expires_at timestamptz NOT NULL
);
