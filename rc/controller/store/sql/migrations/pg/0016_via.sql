-- (job_updated: schema 12's, kept: 0012_queue_edits.sql comes first.)
-- Schema 16 on PostgreSQL (migrations/0016_via.sql): the feed gains
-- job_submitted (a submission through a program named by Rc-Via).

ALTER TABLE events DROP CONSTRAINT events_kind_check;
ALTER TABLE events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'device_unhealthy', 'verify_failed', 'worker_lost', 'job_lost', 'lease_expired',
    'watchdog_trip', 'device_recovered', 'recovery_refused', 'device_cleared',
    'device_retired', 'device_drained', 'device_undrained', 'job_killed',
    'submitted_as', 'token_created', 'token_revoked', 'hold_idle_warning',
    'hold_reclaimed', 'job_requeued', 'job_submitted', 'job_updated'));
