-- The leadership lease of standby controllers (rc.controller.store.leader),
-- PostgreSQL only. Every time is the database's clock (clock_timestamp():
-- the time of the statement, not of its transaction), never a controller's.
-- The lease is the one row of `leadership`.

-- name: leader_seed
-- The row a first takeover updates (epoch 0, long expired); nothing when it is there.
INSERT INTO leadership (id, holder, url, epoch, expires_at)
VALUES (1, '', '', 0, '-infinity') ON CONFLICT (id) DO NOTHING

-- name: leader_take
-- Take the lease once its expires_at has passed: epoch + 1 in one statement.
-- FOR UPDATE waits for every write transaction holding the fence's KEY SHARE
-- lock (a renewal, a plain UPDATE of expires_at, never does), and the expiry
-- is checked again on the row as it is then. No row back: the lease is live.
WITH expired AS (
    SELECT id FROM leadership WHERE id = 1 AND expires_at < clock_timestamp() FOR UPDATE
)
UPDATE leadership
SET holder = %(holder)s, url = %(url)s, epoch = leadership.epoch + 1,
    expires_at = clock_timestamp() + %(ttl)s * interval '1 second'
FROM expired WHERE leadership.id = expired.id
RETURNING leadership.epoch, extract(epoch FROM leadership.expires_at - clock_timestamp())::float8 AS left_s

-- name: leader_renew
-- Extend a live lease this controller holds; no row back: it has lost it.
-- Changes no key column, so it never waits for a write transaction's fence.
UPDATE leadership SET expires_at = clock_timestamp() + %(ttl)s * interval '1 second'
WHERE id = 1 AND holder = %(holder)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
RETURNING extract(epoch FROM expires_at - clock_timestamp())::float8 AS left_s

-- name: leader_peek
-- Who holds the lease, and whether it is live now.
SELECT holder, url, epoch, expires_at > clock_timestamp() AS live FROM leadership WHERE id = 1

-- name: leader_fence
-- Inside every write transaction: this controller's epoch still holds a live
-- lease. FOR KEY SHARE keeps a takeover (its FOR UPDATE) waiting until the
-- transaction ends, so nothing commits after the lease has passed on, while
-- the active's renewals go through (a long batch never costs the lease); and the
-- server ends this transaction's session if it then sits idle for
-- pg.WRITER_IDLE_TIMEOUT_MS (a paused controller: its share lock would hold a takeover
-- up). Set for this transaction only (set_config's true): nothing is left on
-- the session, as a pooler in transaction mode needs.
SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true) FROM leadership
WHERE id = 1 AND holder = %(holder)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
FOR KEY SHARE

-- name: leader_release
-- A clean stop gives the lease up at once: a standby takes over at its next try.
UPDATE leadership SET expires_at = clock_timestamp()
WHERE id = 1 AND holder = %(holder)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
