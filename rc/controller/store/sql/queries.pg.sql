-- rc/controller/store/sql/queries.pg.sql: the named queries whose SQL differs on
-- PostgreSQL (rc.controller.store.pg explains the rule). Every other query of
-- queries.sql runs there as it is, its placeholders translated. Each query
-- here has the same name, the same parameters in the same placeholder style
-- (?, ?N or :name) and the same result columns as in queries.sql; only the
-- dialect changes. tests/store/test_schema_pg.py prepares every query on
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
-- Jobs newest first, filtered by a device among theirs, Unix user, owner (a principal), states (a JSON array, '[]' for any), name (a GLOB, '' for any), submitted at or after :since (0: any) and an id below :before (0: no bound; keyset paging). Listed (rows.listed_job): every column, the command, reason and kill reason as their starts (command_head, reason_head, kill_reason_head: rc.proto.listed).
SELECT id, kind, state, submitter, token_name, selector, device_id, worker_id,
       substr(command, 1, 2048) AS command_head, cwd, env, idempotency_key, request_digest,
       priority, max_runtime, idle_timeout, substr(reason, 1, 257) AS reason_head, stdio,
       exit_code, substr(kill_reason, 1, 257) AS kill_reason_head, kill_requested,
       kill_delivered_at, submitted_at, queued_at, assigned_at, started_at, finished_at, count,
       device_ids, unix_user, name, array_id, array_index, array_item, sessions,
       requeue_on_hardware, restart_count, excluded_device_ids, runtime_asked, owner, spec_bytes,
       stashed, begin_at
FROM jobs
WHERE (:device = '' OR device_id = :device
       OR EXISTS (SELECT 1 FROM jsonb_array_elements_text(jobs.device_ids::jsonb) AS d (value)
                  WHERE d.value = :device))
  AND (:states = '[]' OR state IN (SELECT value FROM jsonb_array_elements_text(:states::jsonb) AS s (value)))
  AND (:user = '' OR unix_user = :user)
  AND (:owner = '' OR owner = :owner)
  AND (:name = '' OR name ~ rc_glob(:name))
  AND (:array = 0 OR array_id = :array)
  AND (:since = 0 OR submitted_at >= :since)
  AND (:before = 0 OR id < :before)
ORDER BY id DESC
LIMIT :limit

-- name: jobs_recent_on_device
-- The newest jobs, not queued, with device ?1 among theirs, at most ?2: those that held a lease on it, and those that named it first (a pinned job cancelled unplaced); listed (as jobs_list).
SELECT j.id, j.kind, j.state, j.submitter, j.token_name, j.selector, j.device_id,
       j.worker_id, substr(j.command, 1, 2048) AS command_head, j.cwd, j.env, j.idempotency_key,
       j.request_digest, j.priority, j.max_runtime, j.idle_timeout,
       substr(j.reason, 1, 257) AS reason_head, j.stdio, j.exit_code,
       substr(j.kill_reason, 1, 257) AS kill_reason_head, j.kill_requested, j.kill_delivered_at,
       j.submitted_at, j.queued_at, j.assigned_at, j.started_at, j.finished_at, j.count,
       j.device_ids, j.unix_user, j.name, j.array_id, j.array_index, j.array_item, j.sessions,
       j.requeue_on_hardware, j.restart_count, j.excluded_device_ids, j.runtime_asked, j.owner,
       j.spec_bytes, j.stashed, j.begin_at
FROM jobs AS j
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
-- The newest events at or after a time, at most ?, oldest first; texts listed (their start: rc.proto.listed).
SELECT * FROM (SELECT id, at, kind, device_id, job_id, actor, substr(text, 1, 257) AS text FROM events WHERE at >= ? ORDER BY id DESC LIMIT ?) AS newest
ORDER BY id

-- name: job_insert_element
-- An array element after its first, with its id given (the first's id plus its
-- position); job_insert's parameters, then its array's.
-- PostgreSQL: the id is given, so the identity sequence is moved past it (a
-- later job_insert must not draw it again).
WITH element AS (
    INSERT INTO jobs (id, kind, state, submitter, token_name, selector, device_id, command, cwd,
                      env, idempotency_key, request_digest, priority, max_runtime, idle_timeout,
                      reason, stdio, submitted_at, queued_at, count, device_ids, unix_user, name,
                      requeue_on_hardware, runtime_asked, owner, spec_bytes, array_id,
                      array_index, array_item, begin_at)
    VALUES (:id, :kind, 'queued', :submitter, :token_name, :selector, :device_id, :command,
            :cwd, :env, :idempotency_key, :request_digest, :priority, :max_runtime,
            :idle_timeout, :reason, :stdio, :now, :now, :count, :device_ids, :unix_user,
            :name, :requeue_on_hardware, :max_runtime, :owner, :spec_bytes, :array_id,
            :array_index, :array_item, :begin_at)
    RETURNING id
)
SELECT setval(pg_get_serial_sequence('jobs', 'id'), id) FROM element

-- name: queued_jobs_ordered
-- The queue in scheduling order: effective priority (priority plus one step per
-- :aging seconds waited; :aging 0 turns aging off; minus its Unix user's
-- fair-share adjustment in :adjust, a JSON object user → steps, '{}' for none), then
-- submission order; blocked as in queued_jobs.
SELECT j.id, j.submitter, j.priority, j.queued_at, j.selector, j.device_id, j.max_runtime,
       j.count, j.device_ids, j.unix_user, j.array_id, coalesce(a.max_running, 0) AS array_cap,
       j.excluded_device_ids,
       (j.stashed = 1 OR j.begin_at > :now
        OR EXISTS (SELECT 1 FROM job_deps AS d JOIN jobs AS a ON a.id = d.after_id
                   WHERE d.job_id = j.id AND NOT dep_met(d.condition, a.state))) AS blocked
FROM jobs AS j LEFT JOIN arrays AS a ON a.id = j.array_id
LEFT JOIN jsonb_each_text(:adjust::jsonb) AS f (key, value) ON f.key = j.unix_user
WHERE j.state = 'queued'
ORDER BY effective_priority(j.priority, j.queued_at, :now, :aging) - coalesce(f.value::bigint, 0) DESC,
         j.id

-- name: queue_ahead_by_ask
-- The queued jobs ahead of job :id in scheduling order (no fair-share
-- adjustment; :eff is job :id's effective priority), counted by what they ask
-- for. A job of a higher priority, or of the same one and a lower id, is ahead
-- whatever it waited (aging only adds steps).
SELECT j.selector, j.device_ids, j.max_runtime, j.unix_user, j.excluded_device_ids,
       count(*) AS n
FROM jobs AS j
WHERE j.state = 'queued' AND (
    j.priority > :eff OR (j.priority = :eff AND j.id < :id)
    OR effective_priority(j.priority, j.queued_at, :now, :aging) > :eff
    OR (effective_priority(j.priority, j.queued_at, :now, :aging) = :eff AND j.id < :id))
GROUP BY j.selector, j.device_ids, j.max_runtime, j.unix_user, j.excluded_device_ids

-- name: queue_ahead_by_ask_adjusted
-- queue_ahead_by_ask under fair share (:adjust as in queued_jobs_ordered).
SELECT j.selector, j.device_ids, j.max_runtime, j.unix_user, j.excluded_device_ids,
       count(*) AS n
FROM jobs AS j LEFT JOIN jsonb_each_text(:adjust::jsonb) AS f (key, value) ON f.key = j.unix_user
WHERE j.state = 'queued' AND (
    effective_priority(j.priority, j.queued_at, :now, :aging) - coalesce(f.value::bigint, 0)
        > :eff
    OR (effective_priority(j.priority, j.queued_at, :now, :aging) - coalesce(f.value::bigint, 0)
        = :eff AND j.id < :id))
GROUP BY j.selector, j.device_ids, j.max_runtime, j.unix_user, j.excluded_device_ids

-- name: events_health_of_device
-- A device's GPU health history, newest first, at most ?: the faults and
-- drains of its health rules ("health: " in the text: rc.worker.health) and
-- what returned it (clears, undrains, recoveries). A scan of the feed: for
-- rc describe only. Texts listed (their start: rc.proto.listed).
SELECT id, at, kind, device_id, job_id, actor, substr(text, 1, 257) AS text FROM events WHERE device_id = ?
  AND (strpos(text, 'health: ') > 0
       OR kind IN ('device_cleared', 'device_undrained', 'device_recovered'))
ORDER BY id DESC LIMIT ?

-- name: decayed_usage
-- Each lease holder's decayed device-seconds at :now (rc.controller.fairshare.decayed,
-- half-life :half_life), leaving out leases released before :horizon.
SELECT holder,
       sum(decayed_seconds(acquired_at, released_at, :now::double precision,
                           :half_life::double precision)) AS used
FROM leases WHERE released_at IS NULL OR released_at > :horizon
GROUP BY holder

-- name: share_weights_all
-- Every fair-share weight an admin set, by user ("user" quoted: a reserved word).
SELECT "user", weight, updated_at FROM share_weights ORDER BY "user"

-- name: share_weight_set
-- Set user ?'s fair-share weight to ? (at ?).
INSERT INTO share_weights ("user", weight, updated_at) VALUES (?, ?, ?)
ON CONFLICT ("user") DO UPDATE SET weight = excluded.weight, updated_at = excluded.updated_at

-- name: share_weight_reset
-- User ? goes back to the default weight (1).
DELETE FROM share_weights WHERE "user" = ?

-- name: device_seconds_by_holder
-- Each lease holder's device-seconds of the leases not rolled up (rolled_seconds_by_holder has the others), leases still held counted up to :now.
SELECT holder,
       sum(greatest(0.0, least(coalesce(released_at, :now), :now) - acquired_at)) AS seconds
FROM leases WHERE rolled = 0 GROUP BY holder ORDER BY holder

-- name: usage_sums
-- The ledger over [:since, :now] of holder :user ('' for all), per key (:by user,
-- host or device; anything else: one row, key ''), kind and state of the job: its
-- device-seconds, idle hold seconds (a hold with no session) and how many jobs
-- (each once per key). A full scan of the leases, which a 30-day window mostly keeps.
WITH l AS (
    SELECT CASE :by WHEN 'user' THEN holder
                    WHEN 'host' THEN substr(device_id, 1, greatest(strpos(device_id, ':') - 1, 0))
                    WHEN 'device' THEN device_id ELSE '' END AS k,
           job_id, kind,
           least(coalesce(released_at, :now), :now) - greatest(acquired_at, :since) AS secs
    FROM leases
    WHERE coalesce(released_at, :now) > :since AND acquired_at < :now
      AND (:user = '' OR holder = :user)
)
SELECT l.k, l.kind, j.state, sum(l.secs) AS seconds,
       sum(CASE WHEN l.kind = 'hold' AND j.sessions = 0 THEN l.secs ELSE 0 END) AS idle,
       count(DISTINCT l.job_id) AS n
FROM l JOIN jobs AS j ON j.id = l.job_id
GROUP BY l.k, l.kind, j.state

-- name: usage_wait_ranks
-- Per key (as usage_sums, by the job's Unix user or first device), how many jobs
-- and holds were granted devices in [:since, :now] and their nearest-rank 50th and
-- 95th percentile wait: the rows ranked ceil(n / 2) and ceil(95 n / 100).
WITH w AS (
    SELECT CASE :by WHEN 'user' THEN unix_user
                    WHEN 'host' THEN substr(device_id, 1, greatest(strpos(device_id, ':') - 1, 0))
                    WHEN 'device' THEN device_id ELSE '' END AS k,
           greatest(0.0, assigned_at - queued_at) AS wait
    FROM jobs
    WHERE assigned_at >= :since AND assigned_at <= :now AND (:user = '' OR unix_user = :user)
), r AS (
    SELECT k, wait, row_number() OVER (PARTITION BY k ORDER BY wait) AS i,
           count(*) OVER (PARTITION BY k) AS n
    FROM w
)
SELECT k, n, i, wait FROM r
WHERE i = (n + 1) / 2 OR i = (95 * n + 99) / 100

-- name: queued_of_user
-- How many jobs run as a Unix user are queued, and their spec bytes (the per-user queued limit and budget).
-- PostgreSQL has no INDEXED BY: its planner takes jobs_queued_by_user by itself.
SELECT count(*) AS n, coalesce(sum(spec_bytes), 0) AS spec_bytes
FROM jobs WHERE state = 'queued' AND unix_user = ?

-- name: holds_idle_watched
-- Running holds with an idle rule, not already asked to end: what the idle
-- watch checks every second (Controller.idle_pass). PostgreSQL has no INDEXED
-- BY: its planner takes the partial index jobs_active for the IN term itself.
SELECT j.id, j.submitter, j.device_id, j.worker_id, j.started_at, h.timeout
FROM jobs j JOIN hold_idle h ON h.job_id = j.id
WHERE j.state IN ('assigned', 'running') AND j.state = 'running' AND j.kind = 'hold'
  AND h.timeout > 0 AND j.kill_requested = 0
ORDER BY j.id

-- name: ledger_job_leases
-- The leases of the jobs in the JSON array ?, each with its job's kind, state and sessions, by job.
SELECT l.job_id, l.holder, l.device_id, l.kind, j.state, j.sessions, l.acquired_at, l.released_at
FROM leases AS l JOIN jobs AS j ON j.id = l.job_id
WHERE l.job_id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value))
ORDER BY l.job_id, l.id

-- name: rollup_waits
-- Of the jobs in the JSON array ?, those granted devices: Unix user, first device, kind, state, when granted and how long queued.
SELECT unix_user, device_id, kind, state, assigned_at, greatest(0.0, assigned_at - queued_at) AS wait
FROM jobs WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value)) AND assigned_at IS NOT NULL

-- name: leases_mark_rolled
-- The leases of the jobs in the JSON array ? are rolled up: 2 for one across a UTC midnight, else 1.
UPDATE leases SET rolled = CASE WHEN floor(acquired_at / 86400)
                                     < floor(released_at / 86400) THEN 2 ELSE 1 END
WHERE job_id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value)) AND rolled = 0

-- name: ledger_unrolled_waits
-- Jobs with a lease not rolled up granted devices in [:since, :now] (run as :user; '' for all), as rollup_waits.
SELECT unix_user, device_id, kind, state, assigned_at, greatest(0.0, assigned_at - queued_at) AS wait
FROM jobs
WHERE id IN (SELECT job_id FROM leases WHERE rolled = 0)
  AND assigned_at >= :since AND assigned_at <= :now AND (:user = '' OR unix_user = :user)

-- name: ledger_edge_waits
-- Jobs rolled up (no lease left that is not) granted devices in [:since, :edge) (run as :user; '' for all), as rollup_waits.
SELECT unix_user, device_id, kind, state, assigned_at, greatest(0.0, assigned_at - queued_at) AS wait
FROM jobs
WHERE assigned_at >= :since AND assigned_at < :edge AND (:user = '' OR unix_user = :user)
  AND NOT EXISTS (SELECT 1 FROM leases WHERE job_id = jobs.id AND rolled = 0)

-- name: retain_arrays_of
-- The arrays the jobs in the JSON array ? are elements of.
SELECT DISTINCT array_id FROM jobs
WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value)) AND array_id IS NOT NULL

-- name: retain_delete_deps
-- Forget the dependencies of and on the jobs in the JSON array ?.
DELETE FROM job_deps
WHERE job_id IN (SELECT value::bigint FROM jsonb_array_elements_text(?1::jsonb) AS d (value)) OR after_id IN (SELECT value::bigint FROM jsonb_array_elements_text(?1::jsonb) AS d (value))

-- name: retain_delete_hold_idle
-- Forget the idle rules of the holds in the JSON array ?.
DELETE FROM hold_idle WHERE job_id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value))

-- name: retain_delete_leases
-- Delete the leases of the jobs in the JSON array ?.
DELETE FROM leases WHERE job_id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value))

-- name: retain_delete_job_events
-- Delete the events about the jobs in the JSON array ?.
DELETE FROM events WHERE job_id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value))

-- name: retain_delete_jobs
-- Delete the jobs in the JSON array ?.
DELETE FROM jobs WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value))

-- name: retain_delete_empty_arrays
-- Delete the arrays in the JSON array ? that have no element left.
DELETE FROM arrays
WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value)) AND NOT EXISTS (SELECT 1 FROM jobs WHERE array_id = arrays.id)

-- name: log_owners
-- Of the jobs in the JSON array ?, each one's Unix user and when it finished (NULL: not yet).
SELECT id, unix_user, finished_at FROM jobs WHERE id IN (SELECT value::bigint FROM jsonb_array_elements_text(?::jsonb) AS d (value))

-- name: usage_days_waits
-- The wait histograms of usage_days_sums' groups: per group, a JSON array of them (added up by the ledger: far faster than json_each here).
SELECT CASE WHEN :g_day = 1 THEN day ELSE 0.0 END AS d,
       CASE WHEN :g_holder = 1 THEN holder ELSE '' END AS u,
       CASE WHEN :g_host = 1 THEN host ELSE '' END AS h, kind, state,
       '[' || string_agg(waits, ',') || ']' AS waits
FROM usage_days
WHERE day >= :from AND day <= :now AND (:user = '' OR holder = :user) AND waits != '{}'
GROUP BY d, u, h, kind, state

-- name: usage_days_sums
-- The rollup rows of the days from :from to :now (of holder :user; '' for all) added up per kind, state and, where :g_day, :g_holder, :g_host are 1, day, holder and host (0 and '' where not).
SELECT CASE WHEN :g_day = 1 THEN day ELSE 0.0 END AS d,
       CASE WHEN :g_holder = 1 THEN holder ELSE '' END AS u,
       CASE WHEN :g_host = 1 THEN host ELSE '' END AS h, kind, state,
       sum(seconds) AS seconds, sum(idle) AS idle, sum(n_user)::bigint AS n_user,
       sum(n_host)::bigint AS n_host, sum(n_day)::bigint AS n_day,
       sum(n_week)::bigint AS n_week
FROM usage_days
WHERE day >= :from AND day <= :now AND (:user = '' OR holder = :user)
GROUP BY d, u, h, kind, state
