"""The store: the one place that reads and writes the controller's database.

What is here: the engines (`db`: the contract, engine-neutral: `Tx`, the
one writer with group commit, the readers; `sqlite`: the embedded SQLite
file; `pg`: the same contract on PostgreSQL, whose module docstring says how
to port a new query or migration), the SQL (`sql/`: the named queries of
`queries.sql`, each with a description under its name, and
`queries.pg.sql`, the few whose SQL differs on PostgreSQL; the migrations
of both engines; their loader, which reads the schema too: rc/store.sql,
rc/store.pg.sql beside it), the row mappers (`rows`: rows → records, so no
row leaves the store), and one module per noun of state, whose functions
are the only code that runs a query:

- `jobs`: every change of a job's state (assign, cancel, withdraw, kill,
  kill delivery, running, release, requeue, lose, reports: the other
  modules call these); `submit`: enqueue and the checks of a submission;
  `jobqueries`: the reads of one job and of a listing (`jobs` re-exports
  both's public names);
- `leases`: grant (one per device of a job being assigned), release, usage;
- `queue`: the queue and the fleet as the planner sees them, request_pass;
- `schedule`: the scheduling pass (reads the queue, plans with
  rc.controller.planning, writes the assignments);
- `workers`: register, heartbeat, leave, the sweep, recovery;
- `devices`: quarantine, fault, clear, retire, drain;
- `labels`: labels and sheets, relabel, the writer's MatchCache;
- `tokens`, `events` (the activity feed), `views` (the read side:
  listings, describe, explain, the census of /metrics).

The contract, for whoever adds to it (or writes a second engine):

- Transaction functions. Every state change is a function `fn(tx, *args)`
  named after what it does (enqueue, assign, release, sweep, register...),
  run whole inside one transaction: `await db.write(jobs.enqueue, new,
  match_cache)`. A read is the same shape through `db.read(fn, *args)`, on a
  reader connection, in one snapshot. Nothing else is awaited inside one,
  and time is `tx.now`, read once per batch. `tx.notify(key)` announces a
  change after its commit (rc.controller.hub); `tx.schedule = True` asks for
  a scheduling pass at the end of the batch (rc.controller.store.schedule).
- One writer, group commit. `Database.write` queues the function for the
  single writer, which runs up to BATCH_MAX queued functions in one
  transaction (on SQLite `BEGIN IMMEDIATE ... COMMIT` with
  `synchronous=FULL`): one fsync for the batch, and nothing acknowledged
  before the commit holding it is durable.
  Each function runs in its own SAVEPOINT: one that raises is rolled back
  alone and its caller gets the exception (a `Refused` becomes the HTTP
  error); the others commit.
- Guarded writes. A write that must change exactly one row, above all a
  transition guarded by the state it expects (`... WHERE id = ? AND state =
  'queued'`), is `tx.change(name, params)`: it raises GuardFailed, naming
  the query, unless exactly one row changed, so a guard that does not hold
  is an error and never a silent no-op. `tx.exec` is for a statement whose
  row count is the answer (and the code uses it) or that changes any number
  of rows by design (and the code says why).
- The boundary. Nothing outside this package calls a Tx query method, uses
  QUERIES, imports sqlite3 or gets a row: a function that answers what it
  read answers records (rc.proto's, the planner's, `rows`'), and no row is
  handed to code outside the store (tests/unit/test_layout.py checks all of
  it); every query the code runs exists, is used and has a description
  (tests/store/test_schema.py).
"""

from __future__ import annotations

from rc.controller.store.db import Database, Tx

__all__ = ["Database", "Tx"]
