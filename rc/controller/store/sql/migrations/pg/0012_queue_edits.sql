-- Schema 12 on PostgreSQL (migrations/0012_queue_edits.sql): stashed jobs
-- and --begin; the feed gains job_updated.

ALTER TABLE jobs ADD COLUMN stashed bigint NOT NULL DEFAULT 0 CHECK (stashed IN (0, 1));
ALTER TABLE jobs ADD COLUMN begin_at double precision NOT NULL DEFAULT 0 CHECK (begin_at >= 0);

CREATE INDEX jobs_parked ON jobs (id) WHERE state = 'queued' AND (stashed = 1 OR begin_at > 0);

ALTER TABLE events DROP CONSTRAINT events_kind_check;
ALTER TABLE events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'device_unhealthy', 'verify_failed', 'worker_lost', 'job_lost', 'lease_expired',
    'watchdog_trip', 'device_recovered', 'recovery_refused', 'device_cleared',
    'device_retired', 'device_drained', 'device_undrained', 'job_killed',
    'submitted_as', 'token_created', 'token_revoked', 'hold_idle_warning',
    'hold_reclaimed', 'job_requeued', 'job_updated'));
