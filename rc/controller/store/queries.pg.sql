-- rc/controller/store/queries.pg.sql: the named queries whose SQL differs on
-- PostgreSQL (rc.controller.store.pg explains the rule). Every other query of
-- queries.sql runs there as it is, its placeholders translated. Each query
-- here has the same name, the same parameters in the same placeholder style
-- (?, ?N or :name) and the same result columns as in queries.sql; only the
-- dialect changes. tests/test_schema_pg.py prepares every query on
-- PostgreSQL and checks each name here exists in queries.sql.
--
-- The dialect, once: SQLite's json_each(x) over an array of ids is
-- jsonb_array_elements_text(x::jsonb) (cast its value to bigint for ids);
-- GLOB is `~ rc_glob(pattern)` (store.pg.sql); INSERT OR IGNORE is
-- ON CONFLICT DO NOTHING; scalar max(a, b) is greatest(a, b); json_extract(x,
-- '$[0]') is x::jsonb ->> 0; a subquery in FROM needs an alias.

-- name: jobs_queued_pinned_to
-- Queued jobs that pin a device among others (a retire cancels them).
SELECT id FROM jobs
WHERE state = 'queued' AND selector = ''
  AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(jobs.device_ids::jsonb) AS d (value)
              WHERE d.value = ?1)

-- name: jobs_to_stop
-- Of the job ids a worker names (a JSON array), those it should stop: ended, or not its own.
SELECT id FROM jobs
WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value))
  AND (state IN ('succeeded', 'failed', 'killed', 'lost') OR worker_id != ?)

-- name: jobs_list
-- Jobs newest first, filtered by a device among theirs, submitter, states (a JSON array, '[]' for any), name (a GLOB, '' for any), submitted at or after :since (0: any) and an id below :before (0: no bound; keyset paging).
SELECT * FROM jobs
WHERE (:device = '' OR device_id = :device
       OR EXISTS (SELECT 1 FROM jsonb_array_elements_text(jobs.device_ids::jsonb) AS d (value)
                  WHERE d.value = :device))
  AND (:states = '[]' OR state IN (SELECT value FROM jsonb_array_elements_text(:states::jsonb) AS s (value)))
  AND (:submitter = '' OR submitter = :submitter)
  AND (:name = '' OR name ~ rc_glob(:name))
  AND (:array = 0 OR array_id = :array)
  AND (:since = 0 OR submitted_at >= :since)
  AND (:before = 0 OR id < :before)
ORDER BY id DESC
LIMIT :limit

-- name: jobs_recent_on_device
-- The newest jobs, not queued, with device ?1 among theirs, at most ?2: those that held a lease on it, and those that named it first (a pinned job cancelled unplaced).
SELECT j.* FROM jobs AS j
WHERE (j.id IN (SELECT job_id FROM leases WHERE device_id = ?1 ORDER BY job_id DESC LIMIT ?2 * 4)
       OR j.id IN (SELECT id FROM jobs WHERE device_id = ?1 ORDER BY id DESC LIMIT ?2 * 4))
  AND j.state != 'queued'
  AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(j.device_ids::jsonb) AS d (value)
              WHERE d.value = ?1)
ORDER BY j.id DESC LIMIT ?2

-- name: dep_insert
-- A dependency: job ? waits for job ? to end as condition ? says.
INSERT INTO job_deps (job_id, after_id, condition) VALUES (?, ?, ?) ON CONFLICT DO NOTHING

-- name: job_assign
-- queued → assigned to its devices (a JSON array, the first is device_id) and their worker; no row when no longer queued.
UPDATE jobs SET state = 'assigned', device_ids = ?1, device_id = (?1::text)::jsonb ->> 0,
                worker_id = ?2, max_runtime = ?3, assigned_at = ?4
WHERE id = ?5 AND state = 'queued'

-- name: leases_renew
-- Extend the live leases of the named jobs (a JSON array) that are this worker's and active.
UPDATE leases SET expires_at = greatest(expires_at, ?)
WHERE released_at IS NULL
  AND job_id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value))
  AND job_id IN (SELECT id FROM jobs WHERE worker_id = ? AND state IN ('assigned', 'running'))

-- name: leases_extend
-- A hold's live leases last at least its new ttl ?1 plus the grace ?2 from when they began.
UPDATE leases SET expires_at = greatest(expires_at, acquired_at + ?1 + ?2)
WHERE job_id = ?3 AND released_at IS NULL

-- name: holds_runtimes
-- Of the job ids a worker names (a JSON array), its active holds and their ttl.
SELECT id, max_runtime FROM jobs
WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text(?1::jsonb) AS d (value))
  AND worker_id = ?2 AND kind = 'hold'
  AND state IN ('assigned', 'running')

-- name: devices_unknown_to_ready
-- A worker's unknown devices with no lease and no job it still runs (?2) → ready.
UPDATE devices SET state = 'ready'
WHERE worker_id = ?1 AND state = 'unknown'
  AND NOT EXISTS (SELECT 1 FROM leases WHERE device_id = devices.id AND released_at IS NULL)
  AND id NOT IN (SELECT d.value FROM jobs, jsonb_array_elements_text(jobs.device_ids::jsonb) AS d (value)
                 WHERE jobs.id IN (SELECT value::bigint
                                   FROM jsonb_array_elements_text(?2::jsonb) AS r (value)))

-- name: devices_worker_lost_to_busy
-- Retention: a returning worker's worker_lost devices whose named job holds a lease → busy.
UPDATE devices SET state = 'busy', quarantine_reason = '', quarantine_detail = '',
                   quarantined_at = NULL
WHERE state = 'unhealthy' AND quarantine_reason = 'worker_lost' AND worker_id = ?2
  AND id IN (SELECT l.device_id FROM leases AS l
             WHERE l.released_at IS NULL
               AND l.job_id IN (SELECT value::bigint
                                FROM jsonb_array_elements_text(?1::jsonb) AS r (value)))

-- name: events_tail
-- The newest events at or after a time, at most ?, oldest first.
SELECT * FROM (SELECT * FROM events WHERE at >= ? ORDER BY id DESC LIMIT ?) AS newest ORDER BY id

-- name: job_insert_element
-- An array element after its first, with its id given (the first's id plus its
-- position); the columns after the id are job_insert's, then its array's.
-- PostgreSQL: the id is given, so the identity sequence is moved past it (a
-- later job_insert must not draw it again).
WITH element AS (
    INSERT INTO jobs (id, kind, state, submitter, token_name, selector, device_id, command, cwd,
                      env, idempotency_key, request_digest, priority, max_runtime, idle_timeout,
                      reason, stdio, submitted_at, queued_at, count, device_ids, unix_user, name,
                      requeue_on_hardware, runtime_asked, array_id, array_index, array_item)
    VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    RETURNING id
)
SELECT setval(pg_get_serial_sequence('jobs', 'id'), id) FROM element
