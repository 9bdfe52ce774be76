-- Schema 6: the idle rule of holds (README "Holds: the idle rule").
--
-- A hold's idle timeout lives in a table of its own: the jobs table's CHECK
-- keeps `idle_timeout` (a job's "no output for D") at 0 for a hold, and the
-- two rules mean different things. A hold with no row (one from before this
-- schema) has no idle rule. The feed gains the warning and the reclaim.

CREATE TABLE hold_idle (
    job_id  INTEGER PRIMARY KEY REFERENCES jobs (id),
    timeout INTEGER NOT NULL CHECK (timeout >= 0)     -- seconds; 0: off
) STRICT;

CREATE TABLE events_new (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        REAL NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN (
        'device_unhealthy', 'verify_failed', 'worker_lost', 'job_lost', 'lease_expired',
        'watchdog_trip', 'device_recovered', 'recovery_refused', 'device_cleared',
        'device_retired', 'device_drained', 'device_undrained', 'job_killed',
        'submitted_as', 'token_created', 'token_revoked', 'hold_idle_warning',
        'hold_reclaimed')),
    device_id TEXT NOT NULL DEFAULT '',
    job_id    INTEGER,
    actor     TEXT NOT NULL DEFAULT '',
    text      TEXT NOT NULL DEFAULT ''
) STRICT;

INSERT INTO events_new (id, at, kind, device_id, job_id, actor, text)
    SELECT id, at, kind, device_id, job_id, actor, text FROM events;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE INDEX events_by_time ON events (at);
