-- Schema 10 on PostgreSQL (migrations/0010_principals.sql says why and how
-- old rows are read): jobs and arrays record the principal that owns them,
-- idempotency keys are unique per owner, a lease is held by its job's Unix
-- user. The loader's step after this file turns name:<n> owners into the
-- uid:<uid> of this host's user n (rc.controller.store.principals).

ALTER TABLE jobs ADD COLUMN owner text;

UPDATE jobs SET owner = coalesce(
    (SELECT 'token:' || t.id FROM tokens AS t
     WHERE t.name = jobs.submitter AND t.created_at <= jobs.submitted_at
       AND (t.revoked_at IS NULL OR t.revoked_at >= jobs.submitted_at)
     ORDER BY t.id DESC LIMIT 1),
    'name:' || jobs.submitter);

UPDATE jobs
SET submitter = CASE WHEN unix_user != '' THEN unix_user || ' (token ' || submitter || ')'
                     ELSE 'token ' || submitter END
WHERE owner LIKE 'token:%';

ALTER TABLE jobs ALTER COLUMN owner SET NOT NULL;
ALTER TABLE jobs ADD CHECK (owner ~ '^(token:[1-9][0-9]*|uid:[0-9]+|name:.+)$');
ALTER TABLE jobs DROP CONSTRAINT jobs_idempotency_key_key;

DROP INDEX jobs_queue_ask;
CREATE INDEX jobs_queue_ask ON jobs (
    selector, device_ids, max_runtime, unix_user, excluded_device_ids,
    priority, queued_at, id, state
) WHERE state = 'queued';
DROP INDEX jobs_queued_by_submitter;
CREATE INDEX jobs_queued_by_user ON jobs (unix_user) WHERE state = 'queued';
DROP INDEX jobs_by_submitter;
CREATE INDEX jobs_by_user ON jobs (unix_user, id DESC);
CREATE INDEX jobs_by_owner ON jobs (owner, id DESC);
CREATE UNIQUE INDEX jobs_owner_key ON jobs (owner, idempotency_key) WHERE idempotency_key IS NOT NULL;

ALTER TABLE arrays ADD COLUMN owner text;
UPDATE arrays SET owner = coalesce((SELECT j.owner FROM jobs AS j WHERE j.id = arrays.id),
                                   'name:' || arrays.submitter),
                  submitter = coalesce((SELECT j.submitter FROM jobs AS j WHERE j.id = arrays.id),
                                       arrays.submitter);
ALTER TABLE arrays ALTER COLUMN owner SET NOT NULL;
ALTER TABLE arrays ADD CHECK (owner ~ '^(token:[1-9][0-9]*|uid:[0-9]+|name:.+)$');

UPDATE leases SET holder = j.unix_user FROM jobs AS j
WHERE j.id = leases.job_id AND j.unix_user != '';
