-- Named queries of the controller, loaded once by rc.controller.store.sql.
-- Each starts at a `-- name: NAME` header, then its description: one line
-- (more `--` lines may follow). tests/store/test_schema.py checks every name the
-- code uses is defined here, every query here is used, and each has a
-- description. Lists travel as JSON arrays through json_each().

-- ---------------------------------------------------------------- jobs

-- name: job_insert
-- A new queued job (submitted and queued :now; the runtime it asked for is
-- its max_runtime until an assignment settles it); returns its id.
INSERT INTO jobs (kind, state, submitter, token_name, selector, device_id, command, cwd, env,
                  idempotency_key, request_digest, priority, max_runtime, idle_timeout, reason,
                  stdio, submitted_at, queued_at, count, device_ids, unix_user, name,
                  requeue_on_hardware, runtime_asked, owner, spec_bytes, begin_at)
VALUES (:kind, 'queued', :submitter, :token_name, :selector, :device_id, :command, :cwd, :env,
        :idempotency_key, :request_digest, :priority, :max_runtime, :idle_timeout, :reason,
        :stdio, :now, :now, :count, :device_ids, :unix_user, :name,
        :requeue_on_hardware, :max_runtime, :owner, :spec_bytes, :begin_at)
RETURNING id

-- name: job_insert_element
-- An array element after its first, with its id given (the first's id plus its
-- position); job_insert's parameters, then its array's.
INSERT INTO jobs (id, kind, state, submitter, token_name, selector, device_id, command, cwd,
                  env, idempotency_key, request_digest, priority, max_runtime, idle_timeout,
                  reason, stdio, submitted_at, queued_at, count, device_ids, unix_user, name,
                  requeue_on_hardware, runtime_asked, owner, spec_bytes, array_id, array_index,
                  array_item, begin_at)
VALUES (:id, :kind, 'queued', :submitter, :token_name, :selector, :device_id, :command, :cwd,
        :env, :idempotency_key, :request_digest, :priority, :max_runtime, :idle_timeout,
        :reason, :stdio, :now, :now, :count, :device_ids, :unix_user, :name,
        :requeue_on_hardware, :max_runtime, :owner, :spec_bytes, :array_id, :array_index,
        :array_item, :begin_at)

-- name: job_set_array
-- An array's first element joins its array (array id, index, item).
UPDATE jobs SET array_id = ?, array_index = ?, array_item = ? WHERE id = ?

-- name: array_insert
-- A new array: id (its first element's), submitter, size, cap, spec, submitted at, owner.
INSERT INTO arrays (id, submitter, size, max_running, spec, submitted_at, owner)
VALUES (?, ?, ?, ?, ?, ?, ?)

-- name: array_get
-- One array's row.
SELECT * FROM arrays WHERE id = ?

-- name: array_counts
-- An array's elements counted by state, with its first start and last end.
SELECT state, count(*) AS n, min(started_at) AS first_start, max(finished_at) AS last_end
FROM jobs WHERE array_id = ? GROUP BY state

-- name: array_failed_indices
-- The indices of an array's elements that ended without succeeding (failed, killed, lost).
SELECT array_index FROM jobs
WHERE array_id = ? AND state IN ('failed', 'killed', 'lost') ORDER BY array_index

-- name: job_get
-- One job's whole row.
SELECT * FROM jobs WHERE id = ?

-- name: job_state
-- One job's state.
SELECT state FROM jobs WHERE id = ?

-- name: job_brief
-- What access checks and reports need of one job.
SELECT id, state, kind, submitter, owner, unix_user, device_id, device_ids, worker_id,
       kill_requested, kill_reason, stdio, submitted_at, selector, requeue_on_hardware,
       restart_count, excluded_device_ids
FROM jobs WHERE id = ?

-- name: job_by_idempotency_key
-- The job an owner (a principal) used an idempotency key for, with its request digest.
SELECT id, request_digest FROM jobs WHERE owner = ? AND idempotency_key = ?

-- name: queued_of_user
-- How many jobs run as a Unix user are queued, and their spec bytes (the
-- per-user queued limit and budget), summed in the partial index of queued
-- jobs, which holds both (without INDEXED BY, SQLite reads jobs_by_user:
-- every job the user ever had, and each one's row for its spec bytes).
SELECT count(*) AS n, coalesce(sum(spec_bytes), 0) AS spec_bytes
FROM jobs INDEXED BY jobs_queued_by_user
WHERE state = 'queued' AND unix_user = ?

-- name: job_update_queued
-- rc update / stash / unstash: a queued job's priority, name, selector, count, max
-- runtime (also the runtime it asks for), stash and begin time (rc.controller.store.edits).
UPDATE jobs SET priority = :priority, name = :name, selector = :selector, count = :count,
                max_runtime = :max_runtime, runtime_asked = :max_runtime, stashed = :stashed,
                begin_at = :begin_at
WHERE id = :id AND state = 'queued'

-- name: job_cancel_queued
-- queued → killed with a reason (a cancel); no row when it was no longer queued.
UPDATE jobs SET state = 'killed', kill_reason = ?, finished_at = ?
WHERE id = ? AND state = 'queued'

-- name: job_withdraw_queued
-- A --no-wait submission that could not start: it is taken back, never kept.
DELETE FROM jobs WHERE id = ? AND state = 'queued'

-- name: job_request_kill
-- Ask an active job's worker to kill it (delivered by its long poll).
UPDATE jobs SET kill_requested = 1, kill_delivered_at = 0, kill_reason = ?
WHERE id = ? AND state IN ('assigned', 'running')

-- name: jobs_assigned_to
-- A worker's assigned jobs, not yet reported running, in id order.
SELECT * FROM jobs WHERE worker_id = ? AND state = 'assigned' ORDER BY id

-- name: kills_due
-- A worker's kill requests never delivered or delivered before ? (a redelivery).
SELECT id FROM jobs
WHERE worker_id = ? AND kill_requested = 1 AND state IN ('assigned', 'running')
  AND kill_delivered_at <= ?

-- name: count_kills_due
-- How many kills_due there are (a read that writes nothing).
SELECT count(*) FROM jobs
WHERE worker_id = ? AND kill_requested = 1 AND state IN ('assigned', 'running')
  AND kill_delivered_at <= ?

-- name: kill_delivered
-- Stamp a kill request as delivered at ?.
UPDATE jobs SET kill_delivered_at = ? WHERE id = ?

-- name: job_mark_running
-- assigned → running at ?; no row when it was past assigned.
UPDATE jobs SET state = 'running', started_at = ? WHERE id = ? AND state = 'assigned'

-- name: job_finish
-- An active job ends: terminal state, exit code, reason, times.
UPDATE jobs SET state = ?, exit_code = ?, kill_reason = ?, finished_at = ?,
                started_at = coalesce(started_at, ?)
WHERE id = ? AND state IN ('assigned', 'running')

-- name: job_requeue
-- An assigned job its worker proves it never started goes back to the queue
-- in its old place (priority, id and queued_at unchanged).
UPDATE jobs SET state = 'queued', worker_id = '', assigned_at = NULL, kill_delivered_at = 0,
                device_id = CASE WHEN selector = '' THEN device_id ELSE '' END,
                device_ids = CASE WHEN selector = '' THEN device_ids ELSE '[]' END
WHERE id = ? AND state = 'assigned'

-- name: job_requeue_after_hardware
-- An active job the hardware failed goes back to the queue in its old place
-- (priority, id and queued_at unchanged), one restart more, never again onto
-- the excluded devices (a JSON array), asking its own max runtime again; the
-- cause stays in kill_reason.
UPDATE jobs SET state = 'queued', worker_id = '', assigned_at = NULL, started_at = NULL,
                max_runtime = runtime_asked,
                kill_delivered_at = 0, exit_code = NULL, device_id = '', device_ids = '[]',
                restart_count = restart_count + 1, excluded_device_ids = ?, kill_reason = ?
WHERE id = ? AND state IN ('assigned', 'running') AND selector != '' AND kill_requested = 0

-- name: job_lose
-- An active job → lost with a reason; no row when it was not active.
UPDATE jobs SET state = 'lost', kill_reason = ?, finished_at = ?
WHERE id = ? AND state IN ('assigned', 'running')

-- name: jobs_active_on_worker
-- The assigned and running jobs of a worker, with their devices.
SELECT id, device_id, device_ids, kind, state FROM jobs
WHERE worker_id = ? AND state IN ('assigned', 'running')

-- name: jobs_queued_of_owner
-- Queued jobs a principal owns (a revoke of its token cancels them).
SELECT id FROM jobs WHERE owner = ? AND state = 'queued' ORDER BY id

-- name: jobs_queued_pinned_to
-- Queued jobs that pin a device among others (a retire cancels them).
SELECT id FROM jobs
WHERE state = 'queued' AND selector = ''
  AND EXISTS (SELECT 1 FROM json_each(jobs.device_ids) WHERE value = ?1)

-- name: jobs_to_stop
-- Of the job ids a worker names (a JSON array), those it should stop: ended, or not its own.
SELECT id FROM jobs
WHERE id IN (SELECT value FROM json_each(?))
  AND (state IN ('succeeded', 'failed', 'killed', 'lost') OR worker_id != ?)

-- name: jobs_list
-- Jobs newest first, filtered by a device among theirs, Unix user, owner (a
-- principal), states (a JSON array, '[]' for any), name (a GLOB, '' for any),
-- submitted at or after :since (0: any) and an id below :before (0: no bound;
-- keyset paging). Listed (rows.listed_job): every column, the command, reason
-- and kill reason as their starts (rc.proto.listed: COMMAND_HEAD_CHARS, TEXT_HEAD_CHARS).
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
       OR EXISTS (SELECT 1 FROM json_each(jobs.device_ids) WHERE value = :device))
  AND (:user = '' OR unix_user = :user)
  AND (:owner = '' OR owner = :owner)
  AND (:states = '[]' OR state IN (SELECT value FROM json_each(:states)))
  AND (:name = '' OR name GLOB :name)
  AND (:array = 0 OR array_id = :array)
  AND (:since = 0 OR submitted_at >= :since)
  AND (:before = 0 OR id < :before)
ORDER BY id DESC
LIMIT :limit

-- name: jobs_active
-- Every assigned or running job, newest first, listed (as jobs_list).
SELECT id, kind, state, submitter, token_name, selector, device_id, worker_id,
       substr(command, 1, 2048) AS command_head, cwd, env, idempotency_key, request_digest,
       priority, max_runtime, idle_timeout, substr(reason, 1, 257) AS reason_head, stdio,
       exit_code, substr(kill_reason, 1, 257) AS kill_reason_head, kill_requested,
       kill_delivered_at, submitted_at, queued_at, assigned_at, started_at, finished_at, count,
       device_ids, unix_user, name, array_id, array_index, array_item, sessions,
       requeue_on_hardware, restart_count, excluded_device_ids, runtime_asked, owner, spec_bytes,
       stashed, begin_at
FROM jobs WHERE state IN ('assigned', 'running') ORDER BY id DESC

-- name: jobs_queued_listed
-- Every queued job, listed (as jobs_list), in priority then id order.
SELECT id, kind, state, submitter, token_name, selector, device_id, worker_id,
       substr(command, 1, 2048) AS command_head, cwd, env, idempotency_key, request_digest,
       priority, max_runtime, idle_timeout, substr(reason, 1, 257) AS reason_head, stdio,
       exit_code, substr(kill_reason, 1, 257) AS kill_reason_head, kill_requested,
       kill_delivered_at, submitted_at, queued_at, assigned_at, started_at, finished_at, count,
       device_ids, unix_user, name, array_id, array_index, array_item, sessions,
       requeue_on_hardware, restart_count, excluded_device_ids, runtime_asked, owner, spec_bytes,
       stashed, begin_at
FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id

-- name: jobs_recent_on_device
-- The newest jobs, not queued, with device ?1 among theirs, at most ?2: those that
-- held a lease on it, and those that named it first (a pinned job cancelled unplaced);
-- listed (as jobs_list).
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
  AND EXISTS (SELECT 1 FROM json_each(j.device_ids) WHERE value = ?1)
ORDER BY j.id DESC LIMIT ?2

-- ---------------------------------------------------------------- scheduling

-- name: queued_jobs
-- What the planner needs of every queued job (with its array's cap), in priority then id
-- order; blocked: stashed, not to begin before a time after :now, or with an unmet dependency.
SELECT j.id, j.submitter, j.priority, j.queued_at, j.selector, j.device_id, j.max_runtime,
       j.count, j.device_ids, j.unix_user, j.array_id, coalesce(a.max_running, 0) AS array_cap,
       j.excluded_device_ids,
       (j.stashed = 1 OR j.begin_at > :now
        OR EXISTS (SELECT 1 FROM job_deps AS d JOIN jobs AS a ON a.id = d.after_id
                   WHERE d.job_id = j.id AND NOT dep_met(d.condition, a.state))) AS blocked
FROM jobs AS j LEFT JOIN arrays AS a ON a.id = j.array_id
WHERE j.state = 'queued' ORDER BY j.priority DESC, j.id

-- name: queued_jobs_ordered
-- The queue in scheduling order: effective priority (priority plus one step per
-- :aging seconds waited; :aging 0 turns aging off; minus its Unix user's
-- fair-share adjustment in :adjust, a JSON object user → steps, '{}' for none), then
-- submission order; blocked as in queued_jobs. The adjustments are a materialized CTE: joined as json_each
-- they were parsed again for every queued job (10,000 queued, 20 users: 30 ms
-- against 19 ms).
WITH f AS MATERIALIZED (SELECT key, value FROM json_each(:adjust))
SELECT j.id, j.submitter, j.priority, j.queued_at, j.selector, j.device_id, j.max_runtime,
       j.count, j.device_ids, j.unix_user, j.array_id, coalesce(a.max_running, 0) AS array_cap,
       j.excluded_device_ids,
       (j.stashed = 1 OR j.begin_at > :now
        OR EXISTS (SELECT 1 FROM job_deps AS d JOIN jobs AS a ON a.id = d.after_id
                   WHERE d.job_id = j.id AND NOT dep_met(d.condition, a.state))) AS blocked
FROM jobs AS j LEFT JOIN arrays AS a ON a.id = j.array_id
LEFT JOIN f ON f.key = j.unix_user
WHERE j.state = 'queued'
ORDER BY effective_priority(j.priority, j.queued_at, :now, :aging) - coalesce(f.value, 0) DESC, j.id

-- name: arrays_active
-- How many elements of each capped array are assigned or running now.
SELECT j.array_id, count(*) AS n FROM jobs AS j JOIN arrays AS a ON a.id = j.array_id
WHERE j.state IN ('assigned', 'running') AND a.max_running > 0
GROUP BY j.array_id

-- name: any_held_queued
-- Whether an element of a capped array, a job with dependencies, or a stashed
-- job or one with a begin time is queued (queue positions then come from a plan;
-- the last through the partial index jobs_parked). Every job's view asks, each submit's
-- among them: the capped arrays are looked up from the arrays table (each
-- through jobs_by_array), and the queue is read for dependencies only when a
-- job ever had one.
SELECT EXISTS (
    SELECT 1 FROM arrays AS a WHERE a.max_running > 0 AND EXISTS (
        SELECT 1 FROM jobs AS j WHERE j.array_id = a.id AND j.state = 'queued')
) OR (EXISTS (SELECT 1 FROM job_deps) AND EXISTS (
    SELECT 1 FROM job_deps AS d JOIN jobs AS j ON j.id = d.job_id WHERE j.state = 'queued'
)) OR EXISTS (
    SELECT 1 FROM jobs WHERE state = 'queued' AND (stashed = 1 OR begin_at > 0)
)

-- name: dep_insert
-- A dependency: job ? waits for job ? to end as condition ? says.
INSERT OR IGNORE INTO job_deps (job_id, after_id, condition) VALUES (?, ?, ?)

-- name: array_element_ids
-- Every element of array ?, in id order.
SELECT id FROM jobs WHERE array_id = ? ORDER BY id

-- name: deps_doomed
-- Queued jobs with a dependency that ended as its condition excludes: it can
-- never be met (the first such dependency of each, with how it ended).
SELECT d.job_id, min(d.after_id) AS after_id FROM job_deps AS d
JOIN jobs AS q ON q.id = d.job_id AND q.state = 'queued'
JOIN jobs AS a ON a.id = d.after_id
WHERE a.state IN ('succeeded', 'failed', 'killed', 'lost') AND NOT dep_met(d.condition, a.state)
GROUP BY d.job_id

-- name: deps_of
-- A job's dependencies with the state and exit code of each.
SELECT d.after_id, d.condition, a.state, a.exit_code FROM job_deps AS d
JOIN jobs AS a ON a.id = d.after_id WHERE d.job_id = ? ORDER BY d.after_id

-- name: queue_ahead_by_ask
-- The queued jobs ahead of job :id in scheduling order (queued_jobs_ordered's
-- order, no fair-share adjustment), counted by what they ask for: target
-- (selector or pinned devices), runtime, Unix user and the devices excluded
-- for them. :eff is job :id's effective priority
-- (rc.controller.planning.effective_priority). Aging only ever adds steps, so
-- a job of a higher priority, or of the same one and a lower id, is ahead
-- whatever it waited: the rule is worked out only for the rest. It is written
-- inline here, not called as effective_priority(): a call into Python per
-- queued job was most of the count's time (the rule's one definition is
-- rc.controller.planning.aged_priority; tests/store/test_queue_position.py holds the
-- two equal). jobs_queue_ask covers the scan and its grouping.
SELECT j.selector, j.device_ids, j.max_runtime, j.unix_user, j.excluded_device_ids,
       count(*) AS n
FROM jobs AS j
WHERE j.state = 'queued' AND (
    j.priority > :eff OR (j.priority = :eff AND j.id < :id)
    OR (:aging > 0 AND (
        j.priority + CAST(max(0.0, :now - j.queued_at) / :aging AS INTEGER) > :eff
        OR (j.priority + CAST(max(0.0, :now - j.queued_at) / :aging AS INTEGER) = :eff
            AND j.id < :id))))
GROUP BY j.selector, j.device_ids, j.max_runtime, j.unix_user, j.excluded_device_ids

-- name: queue_ahead_by_ask_adjusted
-- queue_ahead_by_ask under fair share: each job's effective priority less its
-- Unix user's adjustment (:adjust as in queued_jobs_ordered).
WITH f AS MATERIALIZED (SELECT key, value FROM json_each(:adjust))
SELECT j.selector, j.device_ids, j.max_runtime, j.unix_user, j.excluded_device_ids,
       count(*) AS n
FROM jobs AS j LEFT JOIN f ON f.key = j.unix_user
WHERE j.state = 'queued' AND (
    j.priority - coalesce(f.value, 0) + CASE WHEN :aging > 0
        THEN CAST(max(0.0, :now - j.queued_at) / :aging AS INTEGER) ELSE 0 END > :eff
    OR (j.priority - coalesce(f.value, 0) + CASE WHEN :aging > 0
        THEN CAST(max(0.0, :now - j.queued_at) / :aging AS INTEGER) ELSE 0 END = :eff
        AND j.id < :id))
GROUP BY j.selector, j.device_ids, j.max_runtime, j.unix_user, j.excluded_device_ids

-- name: any_queued
-- Whether any job is queued.
SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'queued')

-- name: any_schedulable
-- Whether any device is ready and not draining.
SELECT EXISTS (SELECT 1 FROM devices WHERE state = 'ready' AND draining = 0)

-- name: device_slots
-- What the planner needs of every device: when the job holding it (a live lease)
-- started (assigned, before it has started) and the runtime it was given, and
-- whom its worker runs jobs as.
SELECT d.id, d.state, d.max_runtime, d.draining,
       coalesce(j.started_at, j.assigned_at) AS since, j.max_runtime AS runtime,
       coalesce(w.run_as, '') AS run_as, coalesce(w.shared_account, 0) AS shared_account,
       coalesce(w.allow_root_jobs, 0) AS allow_root_jobs
FROM devices AS d
LEFT JOIN leases AS l ON l.device_id = d.id AND l.released_at IS NULL
LEFT JOIN jobs AS j ON j.id = l.job_id
LEFT JOIN workers AS w ON w.id = d.worker_id

-- name: device_identities
-- Every device's id, host and name (labels every device has).
SELECT id, host, name FROM devices

-- name: all_labels
-- Every stored label, declared ones first (detected ones overwrite them).
SELECT device_id, key, value FROM device_labels
ORDER BY CASE source WHEN 'declared' THEN 0 ELSE 1 END

-- name: device_links_all
-- Every stored link between two devices of a host (device names, a < b).
SELECT host, a, b, link FROM device_links

-- name: device_links_of_host
-- A host's stored links (device names, a < b).
SELECT a, b, link FROM device_links WHERE host = ?

-- name: device_links_delete
-- Forget a host's topology (every pair, maybe none).
DELETE FROM device_links WHERE host = ?

-- name: device_links_delete_device
-- Forget the links of one device of a host (it was removed).
DELETE FROM device_links WHERE host = ?1 AND (a = ?2 OR b = ?2)

-- name: device_link_insert
-- How two devices of a host are connected.
INSERT INTO device_links (host, a, b, link) VALUES (?, ?, ?, ?)

-- name: live_leases_per_holder
-- Devices held now, per holder (a Unix user: the per-user cap).
SELECT holder, count(*) AS n FROM leases WHERE released_at IS NULL GROUP BY holder

-- name: device_for_assign
-- What an assignment checks of a device.
SELECT id, state, draining, worker_id, max_runtime FROM devices WHERE id = ?

-- name: job_for_assign
-- What an assignment checks and copies of a job.
SELECT id, state, kind, unix_user, max_runtime, reason FROM jobs WHERE id = ?

-- name: device_set_busy
-- ready → busy; no row when it was no longer ready.
UPDATE devices SET state = 'busy' WHERE id = ? AND state = 'ready'

-- name: job_assign
-- queued → assigned to its devices (a JSON array, the first is device_id) and
-- their worker; no row when no longer queued.
UPDATE jobs SET state = 'assigned', device_ids = ?1, device_id = json_extract(?1, '$[0]'),
                worker_id = ?2, max_runtime = ?3, assigned_at = ?4
WHERE id = ?5 AND state = 'queued'

-- ---------------------------------------------------------------- leases

-- name: lease_insert
-- A live lease of a device for a job, held by its Unix user (the schema allows
-- one per device).
INSERT INTO leases (device_id, job_id, holder, kind, reason, acquired_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?)

-- name: lease_release_by_job
-- Release every live lease of a job (they are released together); the devices.
UPDATE leases SET released_at = ? WHERE job_id = ? AND released_at IS NULL
RETURNING device_id

-- name: leases_renew
-- Extend the live leases of the named jobs (a JSON array) that are this worker's and active.
UPDATE leases SET expires_at = max(expires_at, ?)
WHERE released_at IS NULL
  AND job_id IN (SELECT value FROM json_each(?))
  AND job_id IN (SELECT id FROM jobs WHERE worker_id = ? AND state IN ('assigned', 'running'))

-- name: job_extend
-- A hold's ttl (max_runtime) becomes ?1 seconds; no row once it has ended.
UPDATE jobs SET max_runtime = ?1
WHERE id = ?2 AND kind = 'hold' AND state IN ('queued', 'assigned', 'running')

-- name: leases_extend
-- A hold's live leases last at least its new ttl ?1 plus the grace ?2 from when they began.
UPDATE leases SET expires_at = max(expires_at, acquired_at + ?1 + ?2)
WHERE job_id = ?3 AND released_at IS NULL

-- name: holds_runtimes
-- Of the job ids a worker names (a JSON array), its active holds and their ttl.
SELECT id, max_runtime FROM jobs
WHERE id IN (SELECT value FROM json_each(?1)) AND worker_id = ?2 AND kind = 'hold'
  AND state IN ('assigned', 'running')

-- name: leases_expired
-- The jobs with a live lease whose expiry is at or before ?, and the lease's kind.
SELECT DISTINCT job_id, kind FROM leases
WHERE released_at IS NULL AND expires_at <= ?
ORDER BY job_id

-- name: leases_live
-- Every live lease, with its job's command, runtime and display label; the
-- reason and the command listed (their starts: rc.proto.listed).
SELECT l.id, l.device_id, l.job_id, l.holder, l.kind, substr(l.reason, 1, 257) AS reason_head,
       l.acquired_at, l.expires_at, substr(j.command, 1, 2048) AS command_head,
       j.max_runtime AS job_max_runtime, j.submitter AS label
FROM leases AS l JOIN jobs AS j ON j.id = l.job_id
WHERE l.released_at IS NULL

-- name: device_has_live_lease
-- How many live leases a device has (0 or 1).
SELECT count(*) FROM leases WHERE device_id = ? AND released_at IS NULL

-- ---------------------------------------------------------------- devices

-- name: device_ceiling
-- A device's runtime ceiling, or no row for an unknown device.
SELECT id, max_runtime FROM devices WHERE id = ?

-- name: device_state
-- A device's state, quarantine reason and detail, and worker.
SELECT id, state, quarantine_reason, quarantine_detail, worker_id FROM devices WHERE id = ?

-- name: device_get
-- One device's whole row.
SELECT * FROM devices WHERE id = ?

-- name: devices_all
-- Every device, by host and name.
SELECT * FROM devices ORDER BY host, name

-- name: device_free
-- busy → ready once no lease is live on it (a quarantined device stays out).
UPDATE devices SET state = 'ready'
WHERE id = ? AND state = 'busy'
  AND NOT EXISTS (SELECT 1 FROM leases WHERE device_id = devices.id AND released_at IS NULL)

-- name: device_quarantine
-- A device → unhealthy with a reason, a detail and the time.
UPDATE devices SET state = 'unhealthy', quarantine_reason = ?, quarantine_detail = ?,
                   quarantined_at = ?
WHERE id = ?

-- name: device_unquarantine
-- unhealthy → ready, its quarantine forgotten; no row when it was not quarantined.
UPDATE devices SET state = 'ready', quarantine_reason = '', quarantine_detail = '',
                   quarantined_at = NULL
WHERE id = ? AND state = 'unhealthy'

-- name: device_ready_if_busy_or_unknown
-- busy or unknown → ready when no lease is live on it (after a reboot).
UPDATE devices SET state = 'ready'
WHERE id = ? AND state IN ('busy', 'unknown')
  AND NOT EXISTS (SELECT 1 FROM leases WHERE device_id = devices.id AND released_at IS NULL)

-- name: devices_recoverable_on_worker
-- A worker's devices quarantined for a reboot-clearable reason, with no live lease.
SELECT id, quarantine_reason, quarantined_at FROM devices
WHERE worker_id = ? AND state = 'unhealthy'
  AND quarantine_reason IN ('worker_lost', 'lease_expired', 'registration')
  AND NOT EXISTS (SELECT 1 FROM leases WHERE device_id = devices.id AND released_at IS NULL)

-- name: devices_survivor_faulted_on_worker
-- A worker's devices quarantined as `fault` for processes that survived a
-- job's teardown (the detail rc.worker.leftovers writes), with no live lease.
SELECT id, quarantine_reason, quarantined_at FROM devices
WHERE worker_id = ? AND state = 'unhealthy' AND quarantine_reason = 'fault'
  AND (quarantine_detail LIKE 'processes of job % survived teardown: %'
       OR quarantine_detail LIKE 'GPU % still has compute processes: %')
  AND NOT EXISTS (SELECT 1 FROM leases WHERE device_id = devices.id AND released_at IS NULL)

-- name: devices_of_worker
-- A worker's devices.
SELECT id, name, state FROM devices WHERE worker_id = ?

-- name: device_insert
-- A newly declared device, ready.
INSERT INTO devices (id, host, name, worker_id, state, max_runtime, last_heartbeat_at, created_at)
VALUES (?, ?, ?, ?, 'ready', ?, ?, ?)

-- name: device_reregister
-- A device declared again: ceiling, heartbeat, busy or ready by its leases (unhealthy stays).
UPDATE devices SET max_runtime = ?, last_heartbeat_at = ?,
    state = CASE WHEN state = 'unhealthy' THEN 'unhealthy'
                 WHEN EXISTS (SELECT 1 FROM leases WHERE device_id = devices.id
                              AND released_at IS NULL) THEN 'busy'
                 ELSE 'ready' END
WHERE id = ?

-- name: devices_touch
-- Stamp a heartbeat on every device of a worker.
UPDATE devices SET last_heartbeat_at = ? WHERE worker_id = ?

-- name: devices_beat_changes
-- How many of a worker's (?1) devices its heartbeat would change: the unknown ones,
-- and with ?2 = 1 (retention mode, jobs named) those quarantined worker_lost.
SELECT count(*) FROM devices
WHERE worker_id = ?1
  AND (state = 'unknown'
       OR (?2 = 1 AND state = 'unhealthy' AND quarantine_reason = 'worker_lost'))

-- name: devices_unknown_to_busy
-- A worker's unknown devices with a live lease → busy.
UPDATE devices SET state = 'busy'
WHERE worker_id = ? AND state = 'unknown'
  AND EXISTS (SELECT 1 FROM leases WHERE device_id = devices.id AND released_at IS NULL)

-- name: devices_unknown_to_ready
-- A worker's unknown devices with no lease and no job it still runs (?2) → ready.
UPDATE devices SET state = 'ready'
WHERE worker_id = ?1 AND state = 'unknown'
  AND NOT EXISTS (SELECT 1 FROM leases WHERE device_id = devices.id AND released_at IS NULL)
  AND id NOT IN (SELECT d.value FROM jobs, json_each(jobs.device_ids) AS d
                 WHERE jobs.id IN (SELECT value FROM json_each(?2)))

-- name: devices_worker_lost_to_busy
-- Retention: a returning worker's worker_lost devices whose named job holds a lease → busy.
UPDATE devices SET state = 'busy', quarantine_reason = '', quarantine_detail = '',
                   quarantined_at = NULL
WHERE state = 'unhealthy' AND quarantine_reason = 'worker_lost' AND worker_id = ?2
  AND id IN (SELECT l.device_id FROM leases AS l
             WHERE l.released_at IS NULL AND l.job_id IN (SELECT value FROM json_each(?1)))

-- name: devices_demote_on_start
-- A controller start: every ready or busy device → unknown.
UPDATE devices SET state = 'unknown' WHERE state IN ('ready', 'busy')

-- name: devices_to_unknown
-- A worker's ready and busy devices → unknown (silent, or leaving).
UPDATE devices SET state = 'unknown' WHERE worker_id = ? AND state IN ('ready', 'busy')

-- name: device_drain_state
-- Whether a device is draining, and why.
SELECT draining, drain_reason FROM devices WHERE id = ?

-- name: device_drain
-- Set or clear a device's drain and its reason.
UPDATE devices SET draining = ?, drain_reason = ? WHERE id = ?

-- name: event_last_drained
-- The newest device_drained event of a device (who, when).
SELECT actor, at FROM events WHERE kind = 'device_drained' AND device_id = ?
ORDER BY id DESC LIMIT 1

-- name: events_health_of_device
-- A device's GPU health history, newest first, at most ?: the faults and
-- drains of its health rules ("health: " in the text: rc.worker.health) and
-- what returned it (clears, undrains, recoveries). A scan of the feed: for
-- rc describe only. Texts listed (their start: rc.proto.listed).
SELECT id, at, kind, device_id, job_id, actor, substr(text, 1, 257) AS text FROM events WHERE device_id = ?
  AND (instr(text, 'health: ') > 0
       OR kind IN ('device_cleared', 'device_undrained', 'device_recovered'))
ORDER BY id DESC LIMIT ?

-- name: device_delete
-- Remove a device's row.
DELETE FROM devices WHERE id = ?

-- ---------------------------------------------------------------- workers

-- name: worker_get
-- One worker's row.
SELECT * FROM workers WHERE id = ?

-- name: worker_upsert
-- A worker registers: insert it, or update its boot id, instance, version and
-- whom it runs jobs as.
INSERT INTO workers (id, host, boot_id, instance, version, registered_at, last_heartbeat_at,
                     run_as, shared_account, allow_root_jobs)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET boot_id = excluded.boot_id, instance = excluded.instance,
    version = excluded.version, registered_at = excluded.registered_at,
    last_heartbeat_at = excluded.last_heartbeat_at, run_as = excluded.run_as,
    shared_account = excluded.shared_account, allow_root_jobs = excluded.allow_root_jobs

-- name: worker_touch
-- Stamp a worker's heartbeat; no row for a worker that never registered.
UPDATE workers SET last_heartbeat_at = ? WHERE id = ?

-- name: workers_silent
-- Workers whose last heartbeat is at or before ?.
SELECT id, last_heartbeat_at FROM workers WHERE last_heartbeat_at <= ?

-- name: workers_running_as
-- Whom each worker runs jobs as.
SELECT id, run_as, shared_account, allow_root_jobs FROM workers

-- name: workers_all
-- Every worker, by id.
SELECT * FROM workers ORDER BY id

-- ---------------------------------------------------------------- recovery

-- name: recoveries_prune
-- Forget recoveries older than the flap window.
DELETE FROM device_recoveries WHERE at < ?

-- name: recoveries_count
-- How many times a device recovered since ?.
SELECT count(*) FROM device_recoveries WHERE device_id = ? AND at >= ?

-- name: recovery_insert
-- Record a recovery of a device (the flap limit counts them).
INSERT INTO device_recoveries (device_id, at, reason) VALUES (?, ?, ?)

-- name: recovery_refused_since
-- Whether a recovery of this device was refused since it was quarantined (at ?2).
SELECT EXISTS (SELECT 1 FROM events
               WHERE kind = 'recovery_refused' AND device_id = ?1 AND at >= ?2)

-- ---------------------------------------------------------------- labels and sheets

-- name: labels_of
-- A device's labels of one source.
SELECT key, value FROM device_labels WHERE device_id = ? AND source = ?

-- name: labels_of_device
-- Every label of one device, by key, declared before detected.
SELECT * FROM device_labels WHERE device_id = ? ORDER BY key, source DESC

-- name: labels_all_rows
-- Every label row, by device and key.
SELECT * FROM device_labels ORDER BY device_id, key, source DESC

-- name: labels_touch
-- Stamp unchanged labels of one source as seen now.
UPDATE device_labels SET updated_at = ? WHERE device_id = ? AND source = ?

-- name: labels_delete
-- Remove a device's labels of one source.
DELETE FROM device_labels WHERE device_id = ? AND source = ?

-- name: labels_delete_all
-- Remove every label of a device.
DELETE FROM device_labels WHERE device_id = ?

-- name: label_insert
-- One label of a device.
INSERT INTO device_labels (device_id, key, value, source, updated_at) VALUES (?, ?, ?, ?, ?)

-- name: label_set_detected
-- A new value for one detected label a device has (none: no change).
UPDATE device_labels SET value = ?, updated_at = ?
WHERE device_id = ? AND key = ? AND source = 'detected'

-- name: sheet_upsert
-- Store a usage sheet (device_name '' for the host's).
INSERT INTO sheets (host, device_name, body, updated_at) VALUES (?, ?, ?, ?)
ON CONFLICT (host, device_name) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at

-- name: sheet_delete
-- Remove a device's own usage sheet.
DELETE FROM sheets WHERE host = ? AND device_name = ?

-- name: sheets_for_device
-- A device's own sheet and its host's.
SELECT device_name, body, updated_at FROM sheets WHERE host = ? AND device_name IN ('', ?)

-- ---------------------------------------------------------------- events

-- name: event_insert
-- Append an event to the feed; returns its id.
INSERT INTO events (at, kind, device_id, job_id, actor, text) VALUES (?, ?, ?, ?, ?, ?)
RETURNING id

-- name: events_since
-- Events after an id and at or after a time, oldest first, at most ?; texts
-- listed (their start: rc.proto.listed).
SELECT id, at, kind, device_id, job_id, actor, substr(text, 1, 257) AS text FROM events WHERE id > ? AND at >= ? ORDER BY id LIMIT ?

-- name: events_tail
-- The newest events at or after a time, at most ?, oldest first; texts listed
-- (their start: rc.proto.listed).
SELECT * FROM (SELECT id, at, kind, device_id, job_id, actor, substr(text, 1, 257) AS text FROM events WHERE at >= ? ORDER BY id DESC LIMIT ?)
ORDER BY id

-- name: events_last_id
-- The newest event's id, 0 for an empty feed.
SELECT coalesce(max(id), 0) FROM events

-- ---------------------------------------------------------------- tokens

-- name: tokens_live
-- Every token not revoked.
SELECT * FROM tokens WHERE revoked_at IS NULL

-- name: tokens_all
-- Every token, live ones first, then by name.
SELECT * FROM tokens ORDER BY revoked_at IS NOT NULL, name

-- name: tokens_count
-- How many tokens were ever created.
SELECT count(*) FROM tokens

-- name: token_live_by_name
-- The live token with this name.
SELECT * FROM tokens WHERE name = ? AND revoked_at IS NULL

-- name: token_insert
-- A new token (its secret's hash only).
INSERT INTO tokens (name, role, secret_hash, created_by, created_at, expires_at, unix_user)
VALUES (?, ?, ?, ?, ?, ?, ?)

-- name: token_revoke
-- Revoke the live token with this name; no row when there is none.
UPDATE tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL

-- name: jobs_relabel_revoked
-- The jobs of a revoked token's principal read "svc (revoked token ci)", so
-- a new token of the same name ("svc (token ci)") is never confused with it.
UPDATE jobs SET submitter = replace(submitter, ' (token ', ' (revoked token ')
WHERE owner = ? AND submitter LIKE '% (token %'

-- name: token_rotate
-- A new secret for the live token with this name (same id: the same
-- principal); no row when there is none.
UPDATE tokens SET secret_hash = ? WHERE name = ? AND revoked_at IS NULL

-- name: token_bind_host
-- Bind a worker token to its host at its first registration; no row when bound already.
UPDATE tokens SET host = ? WHERE id = ? AND host = '' AND role = 'worker'

-- name: token_live_by_id
-- The live token with this id.
SELECT * FROM tokens WHERE id = ? AND revoked_at IS NULL

-- ---------------------------------------------------------------- metrics (store/views.py census)

-- name: metrics_devices_by_state
-- Devices per state (/metrics).
SELECT state, count(*) AS n FROM devices GROUP BY state

-- name: metrics_devices_quarantined
-- Quarantined devices per reason (/metrics).
SELECT quarantine_reason, count(*) AS n FROM devices WHERE state = 'unhealthy'
GROUP BY quarantine_reason

-- name: metrics_devices_draining
-- How many devices are draining (/metrics).
SELECT count(*) FROM devices WHERE draining = 1

-- name: metrics_queue_by_priority
-- Queued jobs per priority (/metrics).
SELECT priority, count(*) AS n FROM jobs WHERE state = 'queued' GROUP BY priority

-- name: metrics_jobs_by_state
-- Jobs per state (/metrics).
SELECT state, count(*) AS n FROM jobs GROUP BY state

-- name: metrics_events_by_kind
-- Feed events per kind (/metrics).
SELECT kind, count(*) AS n FROM events GROUP BY kind

-- name: decayed_usage
-- Each lease holder's decayed device-seconds at :now (rc.controller.planning.fairshare.decayed,
-- half-life :half_life), leaving out leases released before :horizon.
SELECT holder, sum(decayed_seconds(acquired_at, released_at, :now, :half_life)) AS used
FROM leases WHERE released_at IS NULL OR released_at > :horizon
GROUP BY holder

-- name: queued_users
-- Every Unix user with a job in the queue.
SELECT DISTINCT unix_user FROM jobs WHERE state = 'queued'

-- name: share_weights_all
-- Every fair-share weight an admin set, by user.
SELECT user, weight, updated_at FROM share_weights ORDER BY user

-- name: share_weight_set
-- Set user ?'s fair-share weight to ? (at ?).
INSERT INTO share_weights (user, weight, updated_at) VALUES (?, ?, ?)
ON CONFLICT (user) DO UPDATE SET weight = excluded.weight, updated_at = excluded.updated_at

-- name: share_weight_reset
-- User ? goes back to the default weight (1).
DELETE FROM share_weights WHERE user = ?

-- name: hold_session_opened
-- A session was opened in hold ?.
UPDATE jobs SET sessions = sessions + 1 WHERE id = ? AND kind = 'hold'

-- name: device_seconds_by_holder
-- Each lease holder's device-seconds of the leases not rolled up (rolled_seconds_by_holder has the others), leases still held counted up to :now.
SELECT holder, sum(max(0.0, min(coalesce(released_at, :now), :now) - acquired_at)) AS seconds
FROM leases WHERE rolled = 0 GROUP BY holder ORDER BY holder

-- name: usage_sums
-- The ledger over [:since, :now] of holder :user ('' for all), per key (:by user,
-- host or device; anything else: one row, key ''), kind and state of the job: its
-- device-seconds, idle hold seconds (a hold with no session) and how many jobs
-- (each once per key). A full scan of the leases, which a 30-day window mostly keeps.
WITH l AS (
    SELECT CASE :by WHEN 'user' THEN holder
                    WHEN 'host' THEN substr(device_id, 1, instr(device_id, ':') - 1)
                    WHEN 'device' THEN device_id ELSE '' END AS k,
           job_id, kind,
           min(coalesce(released_at, :now), :now) - max(acquired_at, :since) AS secs
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
                    WHEN 'host' THEN substr(device_id, 1, instr(device_id, ':') - 1)
                    WHEN 'device' THEN device_id ELSE '' END AS k,
           max(0.0, assigned_at - queued_at) AS wait
    FROM jobs
    WHERE assigned_at >= :since AND assigned_at <= :now AND (:user = '' OR unix_user = :user)
), r AS (
    SELECT k, wait, row_number() OVER (PARTITION BY k ORDER BY wait) AS i,
           count(*) OVER (PARTITION BY k) AS n
    FROM w
)
SELECT k, n, i, wait FROM r
WHERE i = (n + 1) / 2 OR i = (95 * n + 99) / 100
-- name: hold_idle_insert
-- A hold's idle timeout (seconds, 0: off), at submit.
INSERT INTO hold_idle (job_id, timeout) VALUES (?, ?)

-- name: hold_idle_of
-- A hold's idle timeout (seconds, 0: off); no row: it has no idle rule.
SELECT timeout FROM hold_idle WHERE job_id = ?

-- name: holds_idle_watched
-- Running holds with an idle rule, not already asked to end: what the idle
-- watch checks every second (Controller.idle_pass): through the partial
-- index jobs_active (its IN term makes it usable), never the whole history.
SELECT j.id, j.submitter, j.device_id, j.worker_id, j.started_at, h.timeout
FROM jobs j INDEXED BY jobs_active JOIN hold_idle h ON h.job_id = j.id
WHERE j.state IN ('assigned', 'running') AND j.state = 'running' AND j.kind = 'hold'
  AND h.timeout > 0 AND j.kill_requested = 0
ORDER BY j.id

-- name: rollup_candidates
-- Up to ? finished jobs and holds with a lease not rolled up and none still held (rc.controller.store.rollups.roll_up).
SELECT DISTINCT l.job_id FROM leases AS l JOIN jobs AS j ON j.id = l.job_id
WHERE l.rolled = 0 AND j.finished_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM leases AS o WHERE o.job_id = l.job_id AND o.released_at IS NULL)
ORDER BY l.job_id LIMIT ?

-- name: ledger_job_leases
-- The leases of the jobs in the JSON array ?, each with its job's kind, state and sessions, by job.
SELECT l.job_id, l.holder, l.device_id, l.kind, j.state, j.sessions, l.acquired_at, l.released_at
FROM leases AS l JOIN jobs AS j ON j.id = l.job_id
WHERE l.job_id IN (SELECT value FROM json_each(?))
ORDER BY l.job_id, l.id

-- name: rollup_waits
-- Of the jobs in the JSON array ?, those granted devices: Unix user, first device, kind, state, when granted and how long queued.
SELECT unix_user, device_id, kind, state, assigned_at, max(0.0, assigned_at - queued_at) AS wait
FROM jobs WHERE id IN (SELECT value FROM json_each(?)) AND assigned_at IS NOT NULL

-- name: usage_day_get
-- One rollup row by its key (day, holder, host, kind, state).
SELECT seconds, idle, n_user, n_host, n_day, n_week, waits FROM usage_days
WHERE day = ? AND holder = ? AND host = ? AND kind = ? AND state = ?

-- name: usage_day_put
-- A rollup row, whole: key (day, holder, host, kind, state), sums, counts and waits.
INSERT INTO usage_days (day, holder, host, kind, state, seconds, idle, n_user, n_host, n_day,
                        n_week, waits)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (day, holder, host, kind, state) DO UPDATE SET
    seconds = excluded.seconds, idle = excluded.idle, n_user = excluded.n_user,
    n_host = excluded.n_host, n_day = excluded.n_day, n_week = excluded.n_week,
    waits = excluded.waits

-- name: leases_mark_rolled
-- The leases of the jobs in the JSON array ? are rolled up: 2 for one across a UTC midnight, else 1.
UPDATE leases SET rolled = CASE WHEN CAST(acquired_at / 86400 AS INTEGER)
                                     < CAST(released_at / 86400 AS INTEGER) THEN 2 ELSE 1 END
WHERE job_id IN (SELECT value FROM json_each(?)) AND rolled = 0

-- name: usage_days_sums
-- The rollup rows of the days from :from to :now (of holder :user; '' for all) added up per kind, state and, where :g_day, :g_holder, :g_host are 1, day, holder and host (0 and '' where not).
SELECT CASE WHEN :g_day = 1 THEN day ELSE 0.0 END AS d,
       CASE WHEN :g_holder = 1 THEN holder ELSE '' END AS u,
       CASE WHEN :g_host = 1 THEN host ELSE '' END AS h, kind, state,
       sum(seconds) AS seconds, sum(idle) AS idle, sum(n_user) AS n_user,
       sum(n_host) AS n_host, sum(n_day) AS n_day, sum(n_week) AS n_week
FROM usage_days
WHERE day >= :from AND day <= :now AND (:user = '' OR holder = :user)
GROUP BY d, u, h, kind, state

-- name: usage_days_waits
-- The wait histograms of usage_days_sums' groups: per group, a JSON array of them (added up by the ledger: far faster than json_each here).
SELECT CASE WHEN :g_day = 1 THEN day ELSE 0.0 END AS d,
       CASE WHEN :g_holder = 1 THEN holder ELSE '' END AS u,
       CASE WHEN :g_host = 1 THEN host ELSE '' END AS h, kind, state,
       '[' || group_concat(waits, ',') || ']' AS waits
FROM usage_days
WHERE day >= :from AND day <= :now AND (:user = '' OR holder = :user) AND waits != '{}'
GROUP BY d, u, h, kind, state

-- name: ledger_unrolled_leases
-- The leases not rolled up (of holder :user; '' for all) that overlap [:since, :now], as ledger_job_leases.
SELECT l.job_id, l.holder, l.device_id, l.kind, j.state, j.sessions, l.acquired_at, l.released_at
FROM leases AS l JOIN jobs AS j ON j.id = l.job_id
WHERE l.rolled = 0 AND (:user = '' OR l.holder = :user)
  AND (l.released_at IS NULL OR l.released_at >= :since) AND l.acquired_at <= :now
ORDER BY l.job_id, l.id

-- name: ledger_unrolled_waits
-- Jobs with a lease not rolled up granted devices in [:since, :now] (run as :user; '' for all), as rollup_waits.
SELECT unix_user, device_id, kind, state, assigned_at, max(0.0, assigned_at - queued_at) AS wait
FROM jobs
WHERE id IN (SELECT job_id FROM leases WHERE rolled = 0)
  AND assigned_at >= :since AND assigned_at <= :now AND (:user = '' OR unix_user = :user)

-- name: ledger_edge_jobs
-- Jobs rolled up that held a device in [:since, :edge), the ledger's first partial day (:day its midnight; of :user, '' for all).
SELECT job_id FROM leases
WHERE rolled != 0 AND acquired_at >= :day AND acquired_at < :edge AND released_at > :since
  AND (:user = '' OR holder = :user)
UNION
SELECT job_id FROM leases
WHERE rolled = 2 AND released_at > :since AND acquired_at < :day
  AND (:user = '' OR holder = :user)

-- name: ledger_edge_waits
-- Jobs rolled up (no lease left that is not) granted devices in [:since, :edge) (run as :user; '' for all), as rollup_waits.
SELECT unix_user, device_id, kind, state, assigned_at, max(0.0, assigned_at - queued_at) AS wait
FROM jobs
WHERE assigned_at >= :since AND assigned_at < :edge AND (:user = '' OR unix_user = :user)
  AND NOT EXISTS (SELECT 1 FROM leases WHERE job_id = jobs.id AND rolled = 0)

-- name: rolled_seconds_by_holder
-- Each holder's device-seconds rolled up (the counter of /metrics adds the leases not rolled up).
SELECT holder, sum(seconds) AS seconds FROM usage_days GROUP BY holder

-- name: retain_expired_jobs
-- Up to ?2 jobs and holds finished before ?1, oldest first, whose leases are all rolled up and that no unfinished job depends on.
SELECT id FROM jobs
WHERE finished_at IS NOT NULL AND finished_at < ?1
  AND NOT EXISTS (SELECT 1 FROM leases WHERE job_id = jobs.id AND rolled = 0)
  AND NOT EXISTS (SELECT 1 FROM job_deps AS d JOIN jobs AS w ON w.id = d.job_id
                  WHERE d.after_id = jobs.id AND w.finished_at IS NULL)
ORDER BY finished_at LIMIT ?2

-- name: retain_arrays_of
-- The arrays the jobs in the JSON array ? are elements of.
SELECT DISTINCT array_id FROM jobs
WHERE id IN (SELECT value FROM json_each(?)) AND array_id IS NOT NULL

-- name: retain_delete_deps
-- Forget the dependencies of and on the jobs in the JSON array ?.
DELETE FROM job_deps
WHERE job_id IN (SELECT value FROM json_each(?1)) OR after_id IN (SELECT value FROM json_each(?1))

-- name: retain_delete_hold_idle
-- Forget the idle rules of the holds in the JSON array ?.
DELETE FROM hold_idle WHERE job_id IN (SELECT value FROM json_each(?))

-- name: retain_delete_leases
-- Delete the leases of the jobs in the JSON array ?.
DELETE FROM leases WHERE job_id IN (SELECT value FROM json_each(?))

-- name: retain_delete_job_events
-- Delete the events about the jobs in the JSON array ?.
DELETE FROM events WHERE job_id IN (SELECT value FROM json_each(?))

-- name: retain_delete_jobs
-- Delete the jobs in the JSON array ?.
DELETE FROM jobs WHERE id IN (SELECT value FROM json_each(?))

-- name: retain_delete_empty_arrays
-- Delete the arrays in the JSON array ? that have no element left.
DELETE FROM arrays
WHERE id IN (SELECT value FROM json_each(?)) AND NOT EXISTS (SELECT 1 FROM jobs WHERE array_id = arrays.id)

-- name: retain_delete_events
-- Delete up to ?2 events older than ?1, oldest first.
DELETE FROM events WHERE id IN (SELECT id FROM events WHERE at < ?1 ORDER BY id LIMIT ?2)

-- name: log_owners
-- Of the jobs in the JSON array ?, each one's Unix user and when it finished (NULL: not yet).
SELECT id, unix_user, finished_at FROM jobs WHERE id IN (SELECT value FROM json_each(?))
