-- Schema 11: a job's spec bytes, for the per-user budget of queued spec bytes
-- (rc serve --max-queued-spec-bytes; README "Limits").
--
-- spec_bytes is what a job's spec takes in the store: its command and its
-- environment as stored (JSON text), its working directory, reason and array
-- item, in UTF-8 bytes (rc.controller.store.jobs.spec_bytes). Every submit
-- sums it over its Unix user's queued jobs in jobs_queued_by_user, which
-- holds it and state (SQLite otherwise reads state from the table despite
-- the index's WHERE: schema 9), so the sum never reads the table. Measured
-- over 1,000 queued jobs of 256 KiB commands: summing length() of the
-- commands takes 600 ms (it counts characters; SQLite before 3.43 has no
-- octet_length), of them cast to blobs 180 ms, and the column alone read
-- from the rows 100 ms (it lies after the command, past its overflow
-- pages); from the index it is well under a millisecond.
-- Existing rows are counted here once.

ALTER TABLE jobs ADD COLUMN spec_bytes INTEGER NOT NULL DEFAULT 0 CHECK (spec_bytes >= 0);

UPDATE jobs SET spec_bytes = length(CAST(command AS BLOB)) + length(CAST(env AS BLOB))
    + length(CAST(cwd AS BLOB)) + length(CAST(reason AS BLOB))
    + length(CAST(array_item AS BLOB));

DROP INDEX jobs_queued_by_user;
CREATE INDEX jobs_queued_by_user ON jobs (unix_user, spec_bytes, state) WHERE state = 'queued';
