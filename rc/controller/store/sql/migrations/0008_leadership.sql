-- Schema 8: the leadership lease of standby controllers (README "More than
-- one box"). Only PostgreSQL uses it (rc.controller.store.leader): an
-- embedded SQLite file has one controller. The table is here too so that
-- both engines have the same tables and the same schema version.

CREATE TABLE leadership (
    id         INTEGER PRIMARY KEY CHECK (id = 1),  -- one row
    holder     TEXT NOT NULL,                       -- the controller instance id
    url        TEXT NOT NULL,                       -- its advertised URL
    epoch      INTEGER NOT NULL CHECK (epoch >= 0), -- +1 at every takeover
    expires_at REAL NOT NULL                        -- by the database's clock
) STRICT;
