-- Schema 15 on PostgreSQL (migrations/0015_retention.sql): the ledger's daily
-- rollups and the marks of leases rolled up, for rc serve --retain.

ALTER TABLE leases ADD COLUMN rolled bigint NOT NULL DEFAULT 0 CHECK (rolled IN (0, 1, 2));

CREATE INDEX leases_unrolled ON leases (job_id) WHERE rolled = 0;
CREATE INDEX leases_rolled_across ON leases (released_at, acquired_at, job_id) WHERE rolled = 2;
CREATE INDEX leases_by_acquired ON leases (acquired_at);
CREATE INDEX jobs_by_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_by_assigned ON jobs (assigned_at) WHERE assigned_at IS NOT NULL;
CREATE INDEX events_by_job ON events (job_id) WHERE job_id IS NOT NULL;

CREATE TABLE usage_days (
    day     double precision NOT NULL,
    holder  text NOT NULL,
    host    text NOT NULL,
    kind    text NOT NULL CHECK (kind IN ('job', 'hold')),
    state   text NOT NULL CHECK (state IN ('succeeded', 'failed', 'killed', 'lost')),
    seconds double precision NOT NULL DEFAULT 0 CHECK (seconds >= 0),
    idle    double precision NOT NULL DEFAULT 0 CHECK (idle >= 0),
    n_user  bigint NOT NULL DEFAULT 0 CHECK (n_user >= 0),
    n_host  bigint NOT NULL DEFAULT 0 CHECK (n_host >= 0),
    n_day   bigint NOT NULL DEFAULT 0 CHECK (n_day >= 0),
    n_week  bigint NOT NULL DEFAULT 0 CHECK (n_week >= 0),
    waits   text NOT NULL DEFAULT '{}',
    PRIMARY KEY (day, holder, host, kind, state)
);
