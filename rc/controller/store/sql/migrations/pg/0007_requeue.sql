-- Schema 7 on PostgreSQL (migrations/0007_requeue.sql): requeue after a
-- hardware failure; the feed gains job_requeued.

ALTER TABLE jobs ADD COLUMN requeue_on_hardware bigint NOT NULL DEFAULT 1 CHECK (requeue_on_hardware IN (0, 1));
ALTER TABLE jobs ADD COLUMN restart_count bigint NOT NULL DEFAULT 0 CHECK (restart_count BETWEEN 0 AND 3);
ALTER TABLE jobs ADD COLUMN excluded_device_ids text NOT NULL DEFAULT '[]' CHECK (json_typeof(excluded_device_ids::json) = 'array');
ALTER TABLE jobs ADD COLUMN runtime_asked bigint NOT NULL DEFAULT 0 CHECK (runtime_asked >= 0);
UPDATE jobs SET runtime_asked = max_runtime;

ALTER TABLE events DROP CONSTRAINT events_kind_check;
ALTER TABLE events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'device_unhealthy', 'verify_failed', 'worker_lost', 'job_lost', 'lease_expired',
    'watchdog_trip', 'device_recovered', 'recovery_refused', 'device_cleared',
    'device_retired', 'device_drained', 'device_undrained', 'job_killed',
    'submitted_as', 'token_created', 'token_revoked', 'hold_idle_warning',
    'hold_reclaimed', 'job_requeued'));
