-- Schema 9 on PostgreSQL (migrations/0009_queue_ask.sql): the queue indexed
-- by what each job asks for, for the position count, and by submitter, for
-- the per-user queued limit.

CREATE INDEX jobs_queue_ask ON jobs (
    selector, device_ids, max_runtime, unix_user, excluded_device_ids,
    priority, queued_at, submitter, id, state
) WHERE state = 'queued';

CREATE INDEX jobs_queued_by_submitter ON jobs (submitter) WHERE state = 'queued';
