-- Schema 5 on PostgreSQL (migrations/0005_usage.sql): a hold's sessions,
-- fair-share weights, the ledger's index. "user" is quoted: a reserved word
-- in PostgreSQL. decayed_seconds is the SQL function SQLite gets from Python.

ALTER TABLE jobs ADD COLUMN sessions bigint NOT NULL DEFAULT 0 CHECK (sessions >= 0);

CREATE TABLE share_weights (
    "user"     text PRIMARY KEY CHECK ("user" != ''),
    weight     double precision NOT NULL CHECK (weight > 0 AND weight <= 1000),
    updated_at double precision NOT NULL
);

CREATE INDEX leases_by_released ON leases (released_at);

-- rc.controller.fairshare.decayed: the decayed device-seconds at now of a
-- lease held from acquired to released (NULL: still held). exp() is kept at
-- or above e^-700: PostgreSQL raises an underflow where Python gives 0.
CREATE FUNCTION decayed_seconds(acquired double precision, released double precision,
                                now double precision, half_life double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN half_life <= 0 OR e <= acquired THEN 0.0
                ELSE (exp(greatest(-k * (now - e), -700.0))
                      - exp(greatest(-k * (now - acquired), -700.0))) / k END
    FROM (SELECT coalesce(least(released, now), now) AS e,
                 ln(2.0) / CASE WHEN half_life > 0 THEN half_life ELSE 1.0 END AS k) AS c
$$;
