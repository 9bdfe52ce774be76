-- Schema 10: people are principals, not names (docs/design.md#identity-and-ownership).
--
-- A job (and an array) records the principal that owns it, `owner`
-- (rc.proto.model.Principal): token:<tokens.id> for an API token, uid:<uid>
-- for a user of the local socket. Ownership is that id, never a name, so a
-- Unix user called like a token gets nothing of the token's. Idempotency
-- keys become unique per owner (the same key from another principal is
-- another submission); `submitter` is the display label ("alice", "alice
-- (token laptop)"); leases are held by their job's Unix user, the account
-- fair share and the per-user limits count.
--
-- Existing rows: a job whose submitter names a token that existed when it
-- was submitted (live then: created before, not yet revoked) is that
-- token's, and its label becomes "UNIXUSER (token NAME)"; for a job an
-- admin submitted --as someone, the submitter is the target, so the
-- target's token. Ambiguous (a socket user named like a token) means the
-- token: the socket user loses access to an old job rather than gaining
-- one. Any other job is `name:<submitter>` here; the loader's step after
-- this file (rc.controller.store.principals.owners_by_uid) turns that into
-- uid:<uid> of the Unix user of that name on this host, and leaves
-- name:<n> (nobody's: admins only) for a name the host no longer knows.
--
-- SQLite cannot drop the UNIQUE of idempotency_key: jobs and arrays are
-- made again (the loader runs migrations with foreign keys off and checks
-- them before it commits), with every index and the trigger.

CREATE TABLE jobs_v10 (
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
    CHECK (selector != '' OR device_id != ''),
    CHECK (kind = 'job' OR (cwd = '' AND env = '{}' AND idle_timeout = 0 AND stdio = '')),
    CHECK ((state IN ('succeeded', 'failed', 'killed', 'lost')) = (finished_at IS NOT NULL))
) STRICT;

INSERT INTO jobs_v10 (
    id, kind, state, submitter, token_name, selector, device_id, worker_id, command, cwd, env,
    idempotency_key, request_digest, priority, max_runtime, idle_timeout, reason, stdio,
    exit_code, kill_reason, kill_requested, kill_delivered_at, submitted_at, queued_at,
    assigned_at, started_at, finished_at, count, device_ids, unix_user, name, array_id,
    array_index, array_item, sessions, requeue_on_hardware, restart_count,
    excluded_device_ids, runtime_asked, owner
)
SELECT
    id, kind, state, submitter, token_name, selector, device_id, worker_id, command, cwd, env,
    idempotency_key, request_digest, priority, max_runtime, idle_timeout, reason, stdio,
    exit_code, kill_reason, kill_requested, kill_delivered_at, submitted_at, queued_at,
    assigned_at, started_at, finished_at, count, device_ids, unix_user, name, array_id,
    array_index, array_item, sessions, requeue_on_hardware, restart_count,
    excluded_device_ids, runtime_asked,
    coalesce(
        (SELECT 'token:' || t.id FROM tokens AS t
         WHERE t.name = jobs.submitter AND t.created_at <= jobs.submitted_at
           AND (t.revoked_at IS NULL OR t.revoked_at >= jobs.submitted_at)
         ORDER BY t.id DESC LIMIT 1),
        'name:' || jobs.submitter)
FROM jobs;

UPDATE jobs_v10
SET submitter = CASE WHEN unix_user != '' THEN unix_user || ' (token ' || submitter || ')'
                     ELSE 'token ' || submitter END
WHERE owner GLOB 'token:*';

-- ids are never reused: the new table goes on from the old one's sequence
-- (a --no-wait job taken back may have had the highest id)
INSERT INTO sqlite_sequence (name, seq)
SELECT 'jobs_v10', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'jobs_v10');
UPDATE sqlite_sequence
SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), 0))
WHERE name = 'jobs_v10';

DROP TABLE jobs;
ALTER TABLE jobs_v10 RENAME TO jobs;

CREATE INDEX jobs_queue ON jobs (priority DESC, id) WHERE state = 'queued';
CREATE INDEX jobs_queue_ask ON jobs (
    selector, device_ids, max_runtime, unix_user, excluded_device_ids,
    priority, queued_at, state
) WHERE state = 'queued';
CREATE INDEX jobs_queued_by_user ON jobs (unix_user) WHERE state = 'queued';
CREATE INDEX jobs_active ON jobs (worker_id) WHERE state IN ('assigned', 'running');
CREATE INDEX jobs_by_device ON jobs (device_id, id DESC);
CREATE INDEX jobs_by_user ON jobs (unix_user, id DESC);
CREATE INDEX jobs_by_owner ON jobs (owner, id DESC);
CREATE UNIQUE INDEX jobs_owner_key ON jobs (owner, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_kill_pending ON jobs (worker_id) WHERE kill_requested = 1;
CREATE INDEX jobs_by_name ON jobs (name, id DESC) WHERE name != '';
CREATE INDEX jobs_by_submitted ON jobs (submitted_at);
CREATE INDEX jobs_by_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;

CREATE TRIGGER jobs_terminal_is_final
BEFORE UPDATE OF state ON jobs
WHEN OLD.state IN ('succeeded', 'failed', 'killed', 'lost') AND NEW.state != OLD.state
BEGIN
    SELECT RAISE(ABORT, 'a job in a terminal state never changes state');
END;

CREATE TABLE arrays_v10 (
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

INSERT INTO arrays_v10 (id, submitter, size, max_running, spec, submitted_at, owner)
SELECT a.id, coalesce(j.submitter, a.submitter), a.size, a.max_running, a.spec, a.submitted_at,
       coalesce(j.owner, 'name:' || a.submitter)
FROM arrays AS a LEFT JOIN jobs AS j ON j.id = a.id;

DROP TABLE arrays;
ALTER TABLE arrays_v10 RENAME TO arrays;

-- A lease is held by its job's Unix user (the account), no longer its label.
UPDATE leases SET holder = (SELECT j.unix_user FROM jobs AS j WHERE j.id = leases.job_id)
WHERE EXISTS (SELECT 1 FROM jobs AS j WHERE j.id = leases.job_id AND j.unix_user != '');
