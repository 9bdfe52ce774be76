-- Schema 5: the usage ledger and fair share (README "Sharing fairly").
--
-- A hold counts the sessions opened in it (rc shell, rc exec, rc cp --hold),
-- so the ledger can say which hold hours had none; share_weights holds the
-- fair-share weight of each user an admin gave one (everyone else: 1).

ALTER TABLE jobs ADD COLUMN sessions INTEGER NOT NULL DEFAULT 0 CHECK (sessions >= 0);

CREATE TABLE share_weights (
    user       TEXT PRIMARY KEY CHECK (user != ''),
    weight     REAL NOT NULL CHECK (weight > 0 AND weight <= 1000),
    updated_at REAL NOT NULL
) STRICT, WITHOUT ROWID;

CREATE INDEX leases_by_released ON leases (released_at);
