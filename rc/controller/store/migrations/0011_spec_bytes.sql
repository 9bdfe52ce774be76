-- Schema 11: a job's spec bytes, for the per-user budget of queued spec bytes
-- (rc serve --max-queued-spec-bytes; README "Limits").
--
-- spec_bytes is what a job's spec takes in the store: its command and its
-- environment as stored (JSON text), its working directory, reason and array
-- item, in UTF-8 bytes (rc.controller.store.jobs.spec_bytes). Every submit
-- sums it over its Unix user's queued jobs, in jobs_queued_by_user, which
-- now holds it, and state (which SQLite otherwise reads from the table
-- despite the index's WHERE: schema 9): the sum never reads the table. Summing the texts' lengths
-- instead reads every queued command whole (SQLite before 3.43 has no
-- octet_length, and length() of a text counts its characters), and a column
-- added here lies after the command in each row, past its overflow pages.
-- Existing rows are counted here once.

ALTER TABLE jobs ADD COLUMN spec_bytes INTEGER NOT NULL DEFAULT 0 CHECK (spec_bytes >= 0);

UPDATE jobs SET spec_bytes = length(CAST(command AS BLOB)) + length(CAST(env AS BLOB))
    + length(CAST(cwd AS BLOB)) + length(CAST(reason AS BLOB))
    + length(CAST(array_item AS BLOB));

DROP INDEX jobs_queued_by_user;
CREATE INDEX jobs_queued_by_user ON jobs (unix_user, spec_bytes, state) WHERE state = 'queued';
