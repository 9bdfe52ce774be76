-- Schema 15: history that ends (rc serve --retain; README "History that ends").
--
-- usage_days holds the ledger of finished jobs and holds as rollups: one row
-- per UTC day, lease holder (the Unix user), host, kind and final state, with
-- the device-seconds, idle hold seconds and job counts of that day (each job
-- counted once per user, host, day and week, on one row:
-- rc.controller.store.rollups) and a histogram of the waits of the jobs granted
-- devices that day (JSON: bucket -> count). A lease is rolled up once its job
-- ended: leases.rolled 1 (2: rolled, and it crosses a UTC midnight, for the
-- ledger's first partial day); the ledger reads the rollups, then only the
-- leases not rolled up yet. Finished jobs older than the retention are then
-- deleted with their leases, events and logs, in bounded batches.

ALTER TABLE leases ADD COLUMN rolled INTEGER NOT NULL DEFAULT 0 CHECK (rolled IN (0, 1, 2));

CREATE INDEX leases_unrolled ON leases (job_id) WHERE rolled = 0;
CREATE INDEX leases_rolled_across ON leases (released_at, acquired_at, job_id) WHERE rolled = 2;
CREATE INDEX leases_by_acquired ON leases (acquired_at);
CREATE INDEX jobs_by_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_by_assigned ON jobs (assigned_at) WHERE assigned_at IS NOT NULL;
CREATE INDEX events_by_job ON events (job_id) WHERE job_id IS NOT NULL;

CREATE TABLE usage_days (
    day     REAL NOT NULL,                        -- its UTC midnight, seconds since the epoch
    holder  TEXT NOT NULL,
    host    TEXT NOT NULL,
    kind    TEXT NOT NULL CHECK (kind IN ('job', 'hold')),
    state   TEXT NOT NULL CHECK (state IN ('succeeded', 'failed', 'killed', 'lost')),
    seconds REAL NOT NULL DEFAULT 0 CHECK (seconds >= 0),
    idle    REAL NOT NULL DEFAULT 0 CHECK (idle >= 0),
    n_user  INTEGER NOT NULL DEFAULT 0 CHECK (n_user >= 0),
    n_host  INTEGER NOT NULL DEFAULT 0 CHECK (n_host >= 0),
    n_day   INTEGER NOT NULL DEFAULT 0 CHECK (n_day >= 0),
    n_week  INTEGER NOT NULL DEFAULT 0 CHECK (n_week >= 0),
    waits   TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (day, holder, host, kind, state)
) STRICT, WITHOUT ROWID;
