-- Schema 12: the queue, edited (README "Editing the queue").
--
-- A queued job may be stashed (rc stash: parked in its place in the queue,
-- taking and reserving nothing, until rc unstash; its id and queued_at, and
-- so its order, are kept) and may carry a time before which it may not start
-- (--begin; 0: none). The activity feed gains job_updated (rc update, rc
-- stash, rc unstash): SQLite cannot change a CHECK, so the events table is
-- rebuilt with its rows.

ALTER TABLE jobs ADD COLUMN stashed INTEGER NOT NULL DEFAULT 0 CHECK (stashed IN (0, 1));
ALTER TABLE jobs ADD COLUMN begin_at REAL NOT NULL DEFAULT 0 CHECK (begin_at >= 0);

CREATE INDEX jobs_parked ON jobs (id) WHERE state = 'queued' AND (stashed = 1 OR begin_at > 0);

ALTER TABLE events RENAME TO events_before_0012;
CREATE TABLE events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        REAL NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN (
        'device_unhealthy', 'verify_failed', 'worker_lost', 'job_lost', 'lease_expired',
        'watchdog_trip', 'device_recovered', 'recovery_refused', 'device_cleared',
        'device_retired', 'device_drained', 'device_undrained', 'job_killed',
        'submitted_as', 'token_created', 'token_revoked', 'hold_idle_warning',
        'hold_reclaimed', 'job_requeued', 'job_updated')),
    device_id TEXT NOT NULL DEFAULT '',
    job_id    INTEGER,
    actor     TEXT NOT NULL DEFAULT '',
    text      TEXT NOT NULL DEFAULT ''
) STRICT;
INSERT INTO events (id, at, kind, device_id, job_id, actor, text)
    SELECT id, at, kind, device_id, job_id, actor, text FROM events_before_0012;
DROP TABLE events_before_0012;
CREATE INDEX events_by_time ON events (at);
