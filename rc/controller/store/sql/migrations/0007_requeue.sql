-- Schema 7: a job the hardware failed goes back to the queue (README
-- "GPU health", "A job the hardware failed").
--
-- A job says whether it may be requeued after a hardware failure (on by
-- default), how many times it was (RC_RESTART_COUNT, at most 3), and the
-- devices it must not be given again (a JSON array of device ids, the
-- faulty ones); and the max runtime it asked for (assignment replaces
-- max_runtime with the bound its devices give it; a requeued job asks
-- again; an existing job's ask is taken as its max_runtime). The activity feed gains the job_requeued kind: SQLite
-- cannot change a CHECK, so the events table is rebuilt with its rows.

ALTER TABLE jobs ADD COLUMN requeue_on_hardware INTEGER NOT NULL DEFAULT 1 CHECK (requeue_on_hardware IN (0, 1));
ALTER TABLE jobs ADD COLUMN restart_count INTEGER NOT NULL DEFAULT 0 CHECK (restart_count BETWEEN 0 AND 3);
ALTER TABLE jobs ADD COLUMN excluded_device_ids TEXT NOT NULL DEFAULT '[]' CHECK (json_type(excluded_device_ids) = 'array');
ALTER TABLE jobs ADD COLUMN runtime_asked INTEGER NOT NULL DEFAULT 0 CHECK (runtime_asked >= 0);
UPDATE jobs SET runtime_asked = max_runtime;

ALTER TABLE events RENAME TO events_before_0007;
CREATE TABLE events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        REAL NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN (
        'device_unhealthy', 'verify_failed', 'worker_lost', 'job_lost', 'lease_expired',
        'watchdog_trip', 'device_recovered', 'recovery_refused', 'device_cleared',
        'device_retired', 'device_drained', 'device_undrained', 'job_killed',
        'submitted_as', 'token_created', 'token_revoked', 'hold_idle_warning',
        'hold_reclaimed', 'job_requeued')),
    device_id TEXT NOT NULL DEFAULT '',
    job_id    INTEGER,
    actor     TEXT NOT NULL DEFAULT '',
    text      TEXT NOT NULL DEFAULT ''
) STRICT;
INSERT INTO events (id, at, kind, device_id, job_id, actor, text)
    SELECT id, at, kind, device_id, job_id, actor, text FROM events_before_0007;
DROP TABLE events_before_0007;
CREATE INDEX events_by_time ON events (at);
