-- Schema 4: a job's name, job arrays, dependencies (README "Names, details
-- and listings", "Arrays", "Dependencies").
--
-- Every job keeps its row with no name ('') and no array. A name is at most
-- 128 characters (rc.proto.model.JOB_NAME_RE says which); the listing's
-- filters find jobs by name and by submission time through two indexes. An
-- array's id is the id of its first element; each element is a job with its
-- index (and, from an array file, its item).

ALTER TABLE jobs ADD COLUMN name TEXT NOT NULL DEFAULT '' CHECK (length(name) <= 128);
ALTER TABLE jobs ADD COLUMN array_id INTEGER CHECK (array_id IS NULL OR array_id > 0);
ALTER TABLE jobs ADD COLUMN array_index INTEGER
    CHECK ((array_index IS NULL) = (array_id IS NULL) AND (array_index IS NULL OR array_index BETWEEN 0 AND 1000000));
ALTER TABLE jobs ADD COLUMN array_item TEXT NOT NULL DEFAULT '' CHECK (array_item = '' OR array_id IS NOT NULL);

CREATE INDEX jobs_by_name ON jobs (name, id DESC) WHERE name != '';
CREATE INDEX jobs_by_submitted ON jobs (submitted_at);
CREATE INDEX jobs_by_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;

CREATE TABLE arrays (
    id           INTEGER PRIMARY KEY,             -- the id of its first element
    submitter    TEXT NOT NULL CHECK (submitter != ''),
    size         INTEGER NOT NULL CHECK (size BETWEEN 1 AND 10000),
    max_running  INTEGER NOT NULL DEFAULT 0 CHECK (max_running BETWEEN 0 AND 10000),
    spec         TEXT NOT NULL,                   -- rc.proto.arrayspec normal form
    submitted_at REAL NOT NULL
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
