-- Schema 3: a job's name (README "Names, details and listings").
--
-- Every job keeps its row with no name (''). A name is at most 128
-- characters (rc.proto.model.JOB_NAME_RE says which); the listing's filters
-- find jobs by name and by submission time through the two indexes.

ALTER TABLE jobs ADD COLUMN name TEXT NOT NULL DEFAULT '' CHECK (length(name) <= 128);

CREATE INDEX jobs_by_name ON jobs (name, id DESC) WHERE name != '';
CREATE INDEX jobs_by_submitted ON jobs (submitted_at);
