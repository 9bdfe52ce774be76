-- rc/store.sql: the whole schema of the controller's database (docs/design.md#the-store).
--
-- Applied to an empty database, then PRAGMA user_version is set to the number
-- of the newest migration (rc/controller/store/sql/migrations/; each one edits
-- this file to match, and tests/store/test_schema.py proves the oldest schema plus
-- every migration equals it). Invariants the schema holds by itself, not
-- only by code:
--   * every enum column has a CHECK listing its values (tests compare them
--     with the Python enums of rc.proto.model);
--   * at most one live lease per device (a partial unique index); a job
--     holds one lease per device it was granted;
--   * idempotency keys are unique per owner;
--   * every job (and array) is owned by a principal of a known shape;
--   * a job in a terminal state never changes state again (trigger).
-- Times are REAL seconds since the Unix epoch; durations INTEGER seconds.

CREATE TABLE workers (
    id                TEXT PRIMARY KEY,           -- the host name
    host              TEXT NOT NULL,
    boot_id           TEXT NOT NULL DEFAULT '',
    instance          TEXT NOT NULL DEFAULT '',   -- the worker process's random id
    version           TEXT NOT NULL DEFAULT '',
    registered_at     REAL NOT NULL,
    last_heartbeat_at REAL NOT NULL,
    -- whom it runs jobs as (RegisterRequest.run_as): '' every job as the job's
    -- own Unix user (a worker running as root), else only that user's jobs
    run_as            TEXT NOT NULL DEFAULT '',
    shared_account    INTEGER NOT NULL DEFAULT 0 CHECK (shared_account IN (0, 1)),
    allow_root_jobs   INTEGER NOT NULL DEFAULT 0 CHECK (allow_root_jobs IN (0, 1))
) STRICT;

CREATE TABLE devices (
    id                TEXT PRIMARY KEY,           -- "host:name"
    host              TEXT NOT NULL,
    name              TEXT NOT NULL,
    worker_id         TEXT NOT NULL,
    state             TEXT NOT NULL
        CHECK (state IN ('ready', 'busy', 'unknown', 'unhealthy')),
    quarantine_reason TEXT NOT NULL DEFAULT ''
        CHECK (quarantine_reason IN ('', 'fault', 'worker_lost', 'lease_expired', 'registration')),
    quarantine_detail TEXT NOT NULL DEFAULT '',
    quarantined_at    REAL,
    draining          INTEGER NOT NULL DEFAULT 0 CHECK (draining IN (0, 1)),
    drain_reason      TEXT NOT NULL DEFAULT '',
    max_runtime       INTEGER NOT NULL DEFAULT 0 CHECK (max_runtime >= 0),
    last_heartbeat_at REAL NOT NULL,
    created_at        REAL NOT NULL,
    UNIQUE (host, name),
    -- only a quarantined device carries a quarantine reason
    CHECK (state = 'unhealthy' OR (quarantine_reason = '' AND quarantine_detail = ''))
) STRICT;

CREATE INDEX devices_by_worker ON devices (worker_id);

CREATE TABLE jobs (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    kind              TEXT NOT NULL DEFAULT 'job' CHECK (kind IN ('job', 'hold')),
    state             TEXT NOT NULL
        CHECK (state IN ('queued', 'assigned', 'running', 'succeeded', 'failed', 'killed', 'lost')),
    submitter         TEXT NOT NULL CHECK (submitter != ''),
    token_name        TEXT NOT NULL DEFAULT '',   -- the token that submitted (differs under --as)
    selector          TEXT NOT NULL DEFAULT '',   -- normalised; '' for a pinned job
    device_id         TEXT NOT NULL DEFAULT '',   -- the first of device_ids (RC_DEVICE)
    worker_id         TEXT NOT NULL DEFAULT '',
    command           TEXT NOT NULL,              -- JSON array of strings
    cwd               TEXT NOT NULL DEFAULT '',
    env               TEXT NOT NULL DEFAULT '{}', -- JSON object of strings
    idempotency_key   TEXT,                       -- unique per owner (jobs_owner_key)
    request_digest    TEXT NOT NULL DEFAULT '',   -- sha256 of the request, for idempotency conflicts
    priority          INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -10 AND 10),
    max_runtime       INTEGER NOT NULL DEFAULT 0 CHECK (max_runtime >= 0),
    idle_timeout      INTEGER NOT NULL DEFAULT 0 CHECK (idle_timeout >= 0),
    reason            TEXT NOT NULL DEFAULT '',
    stdio             TEXT NOT NULL DEFAULT '' CHECK (stdio IN ('', 'tty', 'pipe')),
    exit_code         INTEGER,
    kill_reason       TEXT NOT NULL DEFAULT '',
    kill_requested    INTEGER NOT NULL DEFAULT 0 CHECK (kill_requested IN (0, 1)),
    kill_delivered_at REAL NOT NULL DEFAULT 0,
    submitted_at      REAL NOT NULL,
    queued_at         REAL NOT NULL,
    assigned_at       REAL,
    started_at        REAL,
    finished_at       REAL,
    -- schema 2: a job asks for `count` devices of one host; device_ids is a
    -- JSON array, the pinned list while queued (empty for a selector job),
    -- then the devices it was granted, in the order chosen (RC_DEVICES)
    count             INTEGER NOT NULL DEFAULT 1 CHECK (count BETWEEN 1 AND 64),
    device_ids        TEXT NOT NULL DEFAULT '[]' CHECK (json_type(device_ids) = 'array'),
    unix_user         TEXT NOT NULL DEFAULT '',   -- schema 3: the Unix user it runs as
    -- schema 4: an optional name (rc.proto.model.JOB_NAME_RE), '' for none;
    -- an array element's array (the id of its first element), index and item
    name              TEXT NOT NULL DEFAULT '' CHECK (length(name) <= 128),
    array_id          INTEGER CHECK (array_id IS NULL OR array_id > 0),
    array_index       INTEGER
        CHECK ((array_index IS NULL) = (array_id IS NULL) AND (array_index IS NULL OR array_index BETWEEN 0 AND 1000000)),
    array_item        TEXT NOT NULL DEFAULT '' CHECK (array_item = '' OR array_id IS NOT NULL),
    -- schema 5: sessions opened in a hold (the ledger's idle hold hours)
    sessions          INTEGER NOT NULL DEFAULT 0 CHECK (sessions >= 0),
    -- schema 7: requeued after a hardware failure (when opted in, at most
    -- 3 times: RC_RESTART_COUNT), never again onto excluded_device_ids (JSON)
    requeue_on_hardware INTEGER NOT NULL DEFAULT 1 CHECK (requeue_on_hardware IN (0, 1)),
    restart_count     INTEGER NOT NULL DEFAULT 0 CHECK (restart_count BETWEEN 0 AND 3),
    excluded_device_ids TEXT NOT NULL DEFAULT '[]' CHECK (json_type(excluded_device_ids) = 'array'),
    -- the max runtime it asked for (max_runtime becomes its devices' bound
    -- when assigned; a requeued job asks again)
    runtime_asked     INTEGER NOT NULL DEFAULT 0 CHECK (runtime_asked >= 0),
    -- schema 10: the principal that owns it (rc.proto.model.Principal):
    -- token:<tokens.id>, uid:<uid> (a user of the local socket), or
    -- name:<name> (a job from before principals nobody can be: admins' only);
    -- submitter is its display label, unix_user the account it is counted to
    owner             TEXT NOT NULL CHECK (
        (owner GLOB 'token:[1-9]*' AND NOT substr(owner, 7) GLOB '*[^0-9]*')
        OR (owner GLOB 'uid:[0-9]*' AND NOT substr(owner, 5) GLOB '*[^0-9]*')
        OR owner GLOB 'name:?*'),
    -- schema 11: the bytes its spec takes (command and env as stored, cwd,
    -- reason, array item: rc.controller.store.jobs.spec_bytes), summed over
    -- a user's queued jobs for rc serve --max-queued-spec-bytes
    spec_bytes        INTEGER NOT NULL DEFAULT 0 CHECK (spec_bytes >= 0),
    -- schema 12: parked in the queue (rc stash: it keeps its place, takes
    -- nothing) and the time before which it may not start (--begin; 0: none)
    stashed           INTEGER NOT NULL DEFAULT 0 CHECK (stashed IN (0, 1)),
    begin_at          REAL NOT NULL DEFAULT 0 CHECK (begin_at >= 0),
    CHECK (selector != '' OR device_id != ''),
    CHECK (kind = 'job' OR (cwd = '' AND env = '{}' AND idle_timeout = 0 AND stdio = '')),
    CHECK ((state IN ('succeeded', 'failed', 'killed', 'lost')) = (finished_at IS NOT NULL))
) STRICT;

CREATE INDEX jobs_queue ON jobs (priority DESC, id) WHERE state = 'queued';
-- schema 12: the stashed jobs and those with a begin time, queued (any_held_queued)
CREATE INDEX jobs_parked ON jobs (id) WHERE state = 'queued' AND (stashed = 1 OR begin_at > 0);
-- schema 9: the queue by ask, for the position count (views.queue_position);
-- schema 10: by Unix user (the account), for the per-user queued limit and
-- `rc jobs -u USER`, and by owner, for --mine, a revoke and idempotency keys;
-- schema 11: with each one's spec bytes, for the per-user budget of them
CREATE INDEX jobs_queue_ask ON jobs (
    selector, device_ids, max_runtime, unix_user, excluded_device_ids,
    priority, queued_at, state
) WHERE state = 'queued';
CREATE INDEX jobs_queued_by_user ON jobs (unix_user, spec_bytes, state) WHERE state = 'queued';
CREATE INDEX jobs_active ON jobs (worker_id) WHERE state IN ('assigned', 'running');
CREATE INDEX jobs_by_device ON jobs (device_id, id DESC);
CREATE INDEX jobs_by_user ON jobs (unix_user, id DESC);
CREATE INDEX jobs_by_owner ON jobs (owner, id DESC);
CREATE UNIQUE INDEX jobs_owner_key ON jobs (owner, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_kill_pending ON jobs (worker_id) WHERE kill_requested = 1;
CREATE INDEX jobs_by_name ON jobs (name, id DESC) WHERE name != '';
CREATE INDEX jobs_by_submitted ON jobs (submitted_at);
CREATE INDEX jobs_by_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_by_assigned ON jobs (assigned_at) WHERE assigned_at IS NOT NULL;
CREATE INDEX jobs_by_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;

-- Job arrays (schema 4): one row per array, its elements are jobs.
CREATE TABLE arrays (
    id           INTEGER PRIMARY KEY,             -- the id of its first element
    submitter    TEXT NOT NULL CHECK (submitter != ''),
    size         INTEGER NOT NULL CHECK (size BETWEEN 1 AND 10000),
    max_running  INTEGER NOT NULL DEFAULT 0 CHECK (max_running BETWEEN 0 AND 10000),
    spec         TEXT NOT NULL,                   -- rc.proto.arrayspec normal form
    submitted_at REAL NOT NULL,
    -- schema 10: its elements' owner (jobs.owner); submitter is a label
    owner        TEXT NOT NULL CHECK (
        (owner GLOB 'token:[1-9]*' AND NOT substr(owner, 7) GLOB '*[^0-9]*')
        OR (owner GLOB 'uid:[0-9]*' AND NOT substr(owner, 5) GLOB '*[^0-9]*')
        OR owner GLOB 'name:?*')
) STRICT;

-- Dependencies: job_id waits for after_id to end as `condition` says (ok:
-- succeeded; notok: failed, killed or lost; any: ended at all). Only an
-- existing, earlier job can be named, so a cycle cannot be made.
CREATE TABLE job_deps (
    job_id    INTEGER NOT NULL REFERENCES jobs (id),
    after_id  INTEGER NOT NULL REFERENCES jobs (id),
    condition TEXT NOT NULL CHECK (condition IN ('ok', 'notok', 'any')),
    PRIMARY KEY (job_id, after_id),
    CHECK (after_id < job_id)
) STRICT, WITHOUT ROWID;

CREATE INDEX job_deps_by_after ON job_deps (after_id);

CREATE TRIGGER jobs_terminal_is_final
BEFORE UPDATE OF state ON jobs
WHEN OLD.state IN ('succeeded', 'failed', 'killed', 'lost') AND NEW.state != OLD.state
BEGIN
    SELECT RAISE(ABORT, 'a job in a terminal state never changes state');
END;

CREATE TABLE leases (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    device_id   TEXT NOT NULL,                    -- no foreign key: history outlives devices
    job_id      INTEGER NOT NULL REFERENCES jobs (id),
    holder      TEXT NOT NULL,                    -- its job's Unix user (schema 10): the account
    kind        TEXT NOT NULL CHECK (kind IN ('job', 'hold')),
    reason      TEXT NOT NULL DEFAULT '',
    acquired_at REAL NOT NULL,
    expires_at  REAL NOT NULL,
    released_at REAL,
    -- schema 15: rolled up into usage_days (1; 2: and it crosses a UTC midnight)
    rolled      INTEGER NOT NULL DEFAULT 0 CHECK (rolled IN (0, 1, 2))
) STRICT;

-- The core invariant: at most one live lease per device. A job has one live
-- lease per device it was granted, all inserted in one transaction and
-- released together.
CREATE UNIQUE INDEX leases_one_live_per_device ON leases (device_id) WHERE released_at IS NULL;
CREATE INDEX leases_live_expiry ON leases (expires_at) WHERE released_at IS NULL;
CREATE INDEX leases_by_job ON leases (job_id);
CREATE INDEX leases_by_device ON leases (device_id, job_id DESC);
CREATE INDEX leases_by_released ON leases (released_at);
CREATE INDEX leases_unrolled ON leases (job_id) WHERE rolled = 0;
CREATE INDEX leases_rolled_across ON leases (released_at, acquired_at, job_id) WHERE rolled = 2;
CREATE INDEX leases_by_acquired ON leases (acquired_at);

-- The topology of a host's GPUs (schema 2): how each pair of its devices is
-- connected (rc.proto.model.Link, from `nvidia-smi topo -m`), as its worker
-- last reported it. A pair with no row: unknown when the host has any row,
-- else "no topology" (CPU devices: every pair equal).
CREATE TABLE device_links (
    host TEXT NOT NULL,
    a    TEXT NOT NULL,                           -- device names, a < b
    b    TEXT NOT NULL,
    link TEXT NOT NULL CHECK (link IN ('NV', 'PIX', 'PXB', 'PHB', 'NODE', 'SYS', 'unknown')),
    PRIMARY KEY (host, a, b),
    CHECK (a < b)
) STRICT, WITHOUT ROWID;

CREATE TABLE device_labels (
    device_id  TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    source     TEXT NOT NULL CHECK (source IN ('detected', 'declared')),
    updated_at REAL NOT NULL,
    PRIMARY KEY (device_id, key, source)
) STRICT, WITHOUT ROWID;

-- Usage sheets: host.md (device_name '') and host.d/<device>.md.
CREATE TABLE sheets (
    host        TEXT NOT NULL,
    device_name TEXT NOT NULL DEFAULT '',
    body        TEXT NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (host, device_name)
) STRICT, WITHOUT ROWID;

-- Automatic recoveries, for the flap guard (docs/design.md#quarantine-and-proof).
CREATE TABLE device_recoveries (
    device_id TEXT NOT NULL,
    at        REAL NOT NULL,
    reason    TEXT NOT NULL
) STRICT;

CREATE INDEX device_recoveries_by_device ON device_recoveries (device_id, at);

-- The activity feed (docs/design.md#the-activity-feed).
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

CREATE INDEX events_by_time ON events (at);
CREATE INDEX events_by_job ON events (job_id) WHERE job_id IS NOT NULL;

-- A hold's idle rule (schema 6, README "Holds: the idle rule"): its idle
-- timeout in seconds, 0 for off. A hold with no row has no rule (a job's
-- own idle_timeout, "no output for D", stays 0 on a hold).
CREATE TABLE hold_idle (
    job_id  INTEGER PRIMARY KEY REFERENCES jobs (id),
    timeout INTEGER NOT NULL CHECK (timeout >= 0)     -- seconds; 0: off
) STRICT;

-- API tokens: only the sha256 of the secret is stored.
CREATE TABLE tokens (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL CHECK (name != ''),
    role        TEXT NOT NULL CHECK (role IN ('admin', 'user', 'worker')),
    secret_hash TEXT NOT NULL UNIQUE,
    host        TEXT NOT NULL DEFAULT '',         -- a worker token's bound host
    created_by  TEXT NOT NULL DEFAULT '',
    created_at  REAL NOT NULL,
    expires_at  REAL,
    revoked_at  REAL,
    unix_user   TEXT NOT NULL DEFAULT '',         -- whom its jobs run as ('' for a worker)
    CHECK (role = 'worker' OR host = '')
) STRICT;

-- A name is unique among tokens that are not revoked.
CREATE UNIQUE INDEX tokens_live_name ON tokens (name) WHERE revoked_at IS NULL;

-- Fair-share weights (schema 5): by Unix user (schema 10: the account jobs
-- are counted to); a user with no row has weight 1.
CREATE TABLE share_weights (
    user       TEXT PRIMARY KEY CHECK (user != ''),
    weight     REAL NOT NULL CHECK (weight > 0 AND weight <= 1000),
    updated_at REAL NOT NULL
) STRICT, WITHOUT ROWID;

-- The leadership lease of standby controllers: used on PostgreSQL only
-- (rc.controller.store.leader); here so both engines have the same tables.
CREATE TABLE leadership (
    id         INTEGER PRIMARY KEY CHECK (id = 1),  -- one row
    holder     TEXT NOT NULL,                       -- the controller instance id
    url        TEXT NOT NULL,                       -- its advertised URL
    epoch      INTEGER NOT NULL CHECK (epoch >= 0), -- +1 at every takeover
    expires_at REAL NOT NULL                        -- by the database's clock
) STRICT;

-- The ledger's daily rollups (schema 15, README "History that ends"): per UTC
-- day, lease holder, host, kind and final state of the finished jobs rolled up
-- (rc.controller.store.rollups); waits a JSON histogram (bucket -> count).
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
