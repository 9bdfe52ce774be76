-- Schema 2: a job asks for several devices of one host (README "Several
-- devices for one job").
--
-- Every job keeps its row: count 1, and device_ids the one device it names
-- (its pinned device, or the one it landed on; none for a queued selector
-- job). A job now holds one lease per device, so the index allowing one live
-- lease per job goes (one live lease per device stays). device_links holds
-- each host's GPU topology.

ALTER TABLE jobs ADD COLUMN count INTEGER NOT NULL DEFAULT 1 CHECK (count BETWEEN 1 AND 64);
ALTER TABLE jobs ADD COLUMN device_ids TEXT NOT NULL DEFAULT '[]' CHECK (json_type(device_ids) = 'array');
UPDATE jobs SET device_ids = json_array(device_id) WHERE device_id != '';

DROP INDEX leases_one_live_per_job;
CREATE INDEX leases_by_job ON leases (job_id);
CREATE INDEX leases_by_device ON leases (device_id, job_id DESC);

CREATE TABLE device_links (
    host TEXT NOT NULL,
    a    TEXT NOT NULL,
    b    TEXT NOT NULL,
    link TEXT NOT NULL CHECK (link IN ('NV', 'PIX', 'PXB', 'PHB', 'NODE', 'SYS', 'unknown')),
    PRIMARY KEY (host, a, b),
    CHECK (a < b)
) STRICT, WITHOUT ROWID;
