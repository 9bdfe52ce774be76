-- Schema 6 on PostgreSQL (migrations/0006_hold_idle.sql): a hold's idle
-- rule; the feed gains the warning and the reclaim (PostgreSQL changes a
-- CHECK in place: no rebuild of events).

CREATE TABLE hold_idle (
    job_id  bigint PRIMARY KEY REFERENCES jobs (id),
    timeout bigint NOT NULL CHECK (timeout >= 0)     -- seconds; 0: off
);

ALTER TABLE events DROP CONSTRAINT events_kind_check;
ALTER TABLE events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'device_unhealthy', 'verify_failed', 'worker_lost', 'job_lost', 'lease_expired',
    'watchdog_trip', 'device_recovered', 'recovery_refused', 'device_cleared',
    'device_retired', 'device_drained', 'device_undrained', 'job_killed',
    'submitted_as', 'token_created', 'token_revoked', 'hold_idle_warning',
    'hold_reclaimed'));
