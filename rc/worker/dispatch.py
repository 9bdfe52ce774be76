"""The dispatch: acting on what the controller hands this worker.

A long poll's answer (GET /v1/workers/{id}/assignments), or the assignments
a report reply carried (rc.worker.reporter), holds kills, sessions inside
holds, survivor scans and assignments, handled in that order:

- a kill cancels the job's run here; a kill of a job not running here is
  remembered (rc.worker.runs), so an assignment of it that comes later is
  reported killed, never started;
- a session (rc shell / exec / cp / forward inside a hold, rc.worker.sessions)
  starts once on its own thread, unless the worker is shutting down;
- a survivor scan (rc clear, rc kill of a lost job, rc.worker.recheck) is
  answered once on its own thread;
- an assignment starts a job run (rc.worker.job) unless this run of the job
  started here already or the worker is shutting down (then its leave hands
  it back).

Sessions and scans are numbered per controller run, so each is known by the
instance id of the controller that handed it out as well: a restarted
controller's ids are new ones, though the same numbers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rc.proto.wire import Assignment, Assignments, ScanRequest, SessionStart
from rc.worker.job import JobRun
from rc.worker.reporter import Report
from rc.worker.runs import Runs

__all__ = ["SCANS_KEPT", "Dispatcher"]

SCANS_KEPT = 1024
"""Survivor scans remembered as answered (then it starts over: the
controller hands each out once anyway)."""


class Dispatcher:
    """Acts on the answers of one worker process's long polls; thread-safe.

    runs: the worker's jobs. report(Report): queue a status report (a job
    killed before it started). new_run(assignment): a JobRun of it on this
    worker's devices, not yet started. run_session(SessionStart): run a
    session to its end (rc.worker.sessions.run_session; called on a thread
    of its own). answer_scan(ScanRequest): run a survivor scan and send its
    result (rc.worker.recheck.Recheck.answer; likewise).
    """

    def __init__(
        self,
        runs: Runs,
        report: Callable[[Report], None],
        new_run: Callable[[Assignment], JobRun],
        run_session: Callable[[SessionStart], None],
        answer_scan: Callable[[ScanRequest], None],
    ) -> None:
        self.runs = runs
        self.report = report
        self.new_run = new_run
        self.run_session = run_session
        self.answer_scan = answer_scan
        self._lock = threading.Lock()
        self._sessions: set[tuple[str, int, int]] = set()
        """(controller instance, hold id, session id) of every session
        started (a session is never started twice)."""
        self._scans: set[tuple[str, int]] = set()
        """(controller instance, scan id) of the scans being or been answered."""

    def dispatch(self, got: Assignments, instance: str = "") -> None:
        """Act on one long poll's answer from controller `instance` (its
        instance id; "" for a report reply's assignments, which carry no
        sessions nor scans)."""
        kills = set(got.kills)
        for job_id in kills:
            self.runs.cancel(job_id, "")
        if kills:
            self.runs.note_kills(kills)
        if got.sessions and not self.runs.closed:  # sessions inside holds (rc shell / exec / cp)
            self._start_sessions(got.sessions, instance)
        for req in got.scans:  # survivor scans (rc clear, rc kill of a lost job)
            with self._lock:
                if (instance, req.scan_id) in self._scans:
                    continue
                if len(self._scans) >= SCANS_KEPT:  # each is handed out once anyway
                    self._scans.clear()
                self._scans.add((instance, req.scan_id))
            threading.Thread(
                target=self.answer_scan, args=(req,), name="rc-scan", daemon=True
            ).start()
        for a in got.assignments:
            # a job the hardware requeued comes again with a higher restart count
            admitted, run = self.runs.admit(a, kills, lambda a=a: self.new_run(a))
            if not admitted:
                continue
            if run is None:
                self.report(
                    Report(a.job_id, "killed", None, "killed before this worker started it")
                )
            else:
                run.start()

    def _start_sessions(self, starts: tuple[SessionStart, ...], instance: str) -> None:
        """Start each session not started yet, each on its own thread."""
        for st in starts:
            key = (instance, st.hold_id, st.session_id)
            with self._lock:
                if key in self._sessions:
                    continue
                self._sessions.add(key)
            threading.Thread(
                target=self.run_session,
                args=(st,),
                daemon=True,
                name=f"rc-session-{st.hold_id}.{st.session_id}",
            ).start()
