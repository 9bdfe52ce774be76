-- Rows of a schema-9 database (both engines) for schema 10's migration
-- (tests/test_schema.py, tests/test_schema_pg.py): who owns each job then?
--
-- Tokens: admin (root), alice (revoked at 50) and alice again (made at 60),
-- ci (its jobs run as svc). Jobs, by submitter and time:
--   1 admin at 10: the admin token's (token:1), running, with a lease
--   2 alice at 20: the first alice token's (token:2), an array's first element
--   3 alice at 55: no token alice then: the Unix user alice's, if this host has one
--   4 alice at 70: the second alice token's (token:3)
--   5 ci at 30, sent by admin (--as ci): the token ci's (token:4)
--   6 nobody at 40, sent by admin (--as nobody): the Unix user nobody's
--   7 nobody at 45: a socket user's, the Unix user nobody's
--   8 rc-no-such-user-29 at 46: a name this host does not know (name:...)
-- and job 9, taken back (--no-wait): its id must never be drawn again.

INSERT INTO tokens (id, name, role, secret_hash, created_at, revoked_at, unix_user) VALUES
    (1, 'admin', 'admin', 'h1', 0, NULL, 'root'),
    (2, 'alice', 'user', 'h2', 0, 50, 'alice'),
    (3, 'alice', 'user', 'h3', 60, NULL, 'alice'),
    (4, 'ci', 'user', 'h4', 0, NULL, 'svc');

INSERT INTO devices (id, host, name, worker_id, state, last_heartbeat_at, created_at) VALUES
    ('h:gpu0', 'h', 'gpu0', 'h', 'busy', 0, 0);

INSERT INTO jobs (id, kind, state, submitter, token_name, selector, device_id, worker_id,
                  command, idempotency_key, submitted_at, queued_at, assigned_at, started_at,
                  unix_user, device_ids, array_id, array_index) VALUES
    (1, 'job', 'running', 'admin', 'admin', '*', 'h:gpu0', 'h', '["train"]', 'k', 10, 10, 11, 12,
     'root', '["h:gpu0"]', NULL, NULL),
    (2, 'job', 'queued', 'alice', 'alice', '*', '', '', '["true"]', 'k2', 20, 20, NULL, NULL,
     'alice', '[]', 2, 0),
    (3, 'job', 'queued', 'alice', 'alice', '*', '', '', '["true"]', NULL, 55, 55, NULL, NULL,
     'alice', '[]', NULL, NULL),
    (4, 'job', 'queued', 'alice', 'alice', '*', '', '', '["true"]', NULL, 70, 70, NULL, NULL,
     'alice', '[]', NULL, NULL),
    (5, 'job', 'queued', 'ci', 'admin', '*', '', '', '["true"]', NULL, 30, 30, NULL, NULL,
     'svc', '[]', NULL, NULL),
    (6, 'job', 'queued', 'nobody', 'admin', '*', '', '', '["true"]', NULL, 40, 40, NULL, NULL,
     'nobody', '[]', NULL, NULL),
    (7, 'job', 'queued', 'nobody', 'nobody', '*', '', '', '["true"]', NULL, 45, 45, NULL, NULL,
     'nobody', '[]', NULL, NULL),
    (8, 'job', 'queued', 'rc-no-such-user-29', 'rc-no-such-user-29', '*', '', '', '["true"]',
     NULL, 46, 46, NULL, NULL, 'rc-no-such-user-29', '[]', NULL, NULL),
    (9, 'job', 'queued', 'nobody', 'nobody', '*', '', '', '["true"]', NULL, 47, 47, NULL, NULL,
     'nobody', '[]', NULL, NULL);

DELETE FROM jobs WHERE id = 9;

INSERT INTO arrays (id, submitter, size, max_running, spec, submitted_at) VALUES
    (2, 'alice', 1, 0, '0', 20);

INSERT INTO job_deps (job_id, after_id, condition) VALUES (4, 1, 'ok');

INSERT INTO leases (device_id, job_id, holder, kind, acquired_at, expires_at) VALUES
    ('h:gpu0', 1, 'admin', 'job', 11, 1000);
