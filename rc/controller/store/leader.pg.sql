-- The leadership lease of standby controllers (rc.controller.store.leader),
-- PostgreSQL only. Every time is the database's clock (clock_timestamp():
-- the time of the statement, not of its transaction), never a controller's.
-- The lease is the one row of `leadership`.

-- name: leader_take
-- Take the lease when there is none yet or it has expired: epoch + 1 in one
-- statement. No row back: another controller holds a live lease.
INSERT INTO leadership (id, holder, url, epoch, expires_at)
VALUES (1, %(holder)s, %(url)s, 1, clock_timestamp() + %(ttl)s * interval '1 second')
ON CONFLICT (id) DO UPDATE
    SET holder = excluded.holder, url = excluded.url, epoch = leadership.epoch + 1,
        expires_at = excluded.expires_at
    WHERE leadership.expires_at < clock_timestamp()
RETURNING epoch, extract(epoch FROM expires_at - clock_timestamp())::float8 AS left_s

-- name: leader_renew
-- Extend a live lease this controller holds; no row back: it has lost it.
UPDATE leadership SET expires_at = clock_timestamp() + %(ttl)s * interval '1 second'
WHERE id = 1 AND holder = %(holder)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
RETURNING extract(epoch FROM expires_at - clock_timestamp())::float8 AS left_s

-- name: leader_peek
-- Who holds the lease, and whether it is live now.
SELECT holder, url, epoch, expires_at > clock_timestamp() AS live FROM leadership WHERE id = 1

-- name: leader_fence
-- Inside every write transaction: this controller's epoch still holds a live
-- lease. FOR SHARE keeps a takeover (an UPDATE of the row) waiting until the
-- transaction ends, so nothing commits after the lease has passed on; and the
-- server ends this transaction's session if it then sits idle for
-- pg.WRITER_IDLE_TIMEOUT_MS (a paused controller: its share lock would hold a takeover
-- up). Set for this transaction only (set_config's true): nothing is left on
-- the session, as a pooler in transaction mode needs.
SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true) FROM leadership
WHERE id = 1 AND holder = %(holder)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
FOR SHARE

-- name: leader_release
-- A clean stop gives the lease up at once: a standby takes over at its next try.
UPDATE leadership SET expires_at = clock_timestamp()
WHERE id = 1 AND holder = %(holder)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
