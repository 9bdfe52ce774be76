-- (job_updated: schema 12's, kept: 0012_queue_edits.sql comes first.)
-- Schema 16: the activity feed gains job_submitted, a submission made
-- through a program that names itself with the Rc-Via request header (rc
-- mcp sends "mcp": README "Agents: rc mcp"), so an agent's every write is on
-- record, with the caller's label as its actor. SQLite cannot change a
-- CHECK, so the events table is rebuilt with its rows and its index.

ALTER TABLE events RENAME TO events_before_0016;
CREATE TABLE events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        REAL NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN (
        'device_unhealthy', 'verify_failed', 'worker_lost', 'job_lost', 'lease_expired',
        'watchdog_trip', 'device_recovered', 'recovery_refused', 'device_cleared',
        'device_retired', 'device_drained', 'device_undrained', 'job_killed',
        'submitted_as', 'token_created', 'token_revoked', 'hold_idle_warning',
        'hold_reclaimed', 'job_requeued', 'job_submitted', 'job_updated')),
    device_id TEXT NOT NULL DEFAULT '',
    job_id    INTEGER,
    actor     TEXT NOT NULL DEFAULT '',
    text      TEXT NOT NULL DEFAULT ''
) STRICT;
INSERT INTO events (id, at, kind, device_id, job_id, actor, text)
    SELECT id, at, kind, device_id, job_id, actor, text FROM events_before_0016;
DROP TABLE events_before_0016;
CREATE INDEX events_by_time ON events (at);
CREATE INDEX events_by_job ON events (job_id) WHERE job_id IS NOT NULL;
