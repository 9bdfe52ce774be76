-- Schema 3: jobs run as the people who submit them.
--
-- A token names the Unix user its jobs run as (a worker token none); a job
-- records the Unix user it runs as, its submitter's at submit; a worker says
-- at registration whom it runs jobs as. Existing tokens and jobs take their
-- own name (a worker token ''), which is what `rc token create NAME` maps to
-- now; existing workers say nothing until they register again.

ALTER TABLE tokens ADD COLUMN unix_user TEXT NOT NULL DEFAULT '';
UPDATE tokens SET unix_user = name WHERE role != 'worker';
ALTER TABLE jobs ADD COLUMN unix_user TEXT NOT NULL DEFAULT '';
UPDATE jobs SET unix_user = submitter;
ALTER TABLE workers ADD COLUMN run_as TEXT NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN shared_account INTEGER NOT NULL DEFAULT 0 CHECK (shared_account IN (0, 1));
ALTER TABLE workers ADD COLUMN allow_root_jobs INTEGER NOT NULL DEFAULT 0 CHECK (allow_root_jobs IN (0, 1));
