-- Schema 11 on PostgreSQL (migrations/0011_spec_bytes.sql): a job's spec
-- bytes, for the per-user budget of queued spec bytes, held by
-- jobs_queued_by_user so the sum at every submit is an index-only scan.

ALTER TABLE jobs ADD COLUMN spec_bytes bigint NOT NULL DEFAULT 0 CHECK (spec_bytes >= 0);

UPDATE jobs SET spec_bytes = octet_length(command) + octet_length(env) + octet_length(cwd)
    + octet_length(reason) + octet_length(array_item);

DROP INDEX jobs_queued_by_user;
CREATE INDEX jobs_queued_by_user ON jobs (unix_user, spec_bytes, state) WHERE state = 'queued';
