"""Tokens name Unix users, and every job records the one it runs as
(docs/design.md#identity-and-ownership).

In-process (tests.helpers.inprocess.Lab) and pure: the token rule, the job's Unix
user at submit (its own, or under --as the target's), and the name rule.
"""

from __future__ import annotations

import pwd

import pytest

from rc.controller.api.admin import token_unix_user
from rc.controller.auth import Caller, hash_secret, new_secret
from rc.controller.errors import Refused
from rc.controller.store import jobs, tokens
from rc.controller.submission import validate_submit
from rc.proto.model import Role, valid_unix_user
from rc.proto.wire import SubmitRequest
from tests.helpers.inprocess import Lab


@pytest.fixture
def lab(tmp_path):
    lb = Lab(tmp_path / "data")
    lb.register("box", {"g0": (0, {}), "g1": (0, {})}, allow_root_jobs=True)
    yield lb
    lb.close()


@pytest.mark.parametrize(
    "name,ok",
    [
        ("alice", True),
        ("rc-test-bob", True),
        ("_svc", True),
        ("build$", True),
        ("a" * 32, True),
        ("a" * 33, False),
        # what Debian's useradd takes (shadow 4.13), as LDAP/AD names are:
        # refused before, so these people could not use a shared box at all
        ("Alice", True),
        ("Erin", True),
        ("john.doe", True),
        ("ann.b", True),
        ("9lives", True),
        ("ci@lab", True),
        ("é" * 16, True),  # 32 bytes
        ("é" * 17, False),  # 34 bytes: useradd's limit is bytes
        # and what it refuses, or rc does
        ("-x", False),
        ("+x", False),
        ("~x", False),
        ("a:b", False),
        ("a,b", False),
        ("a b", False),
        ("a\tb", False),
        ("a\x01b", False),
        ("a\x7fb", False),
        ("a/b", False),
        ("1234", False),  # digits only: it reads as a uid
        (".", False),
        ("..", False),
        ("alice (token laptop)", False),  # a token's label is never a user's name
        ("", False),
    ],
)
def test_a_unix_user_name_is_what_useradd_takes(name, ok):
    assert valid_unix_user(name) is ok


def test_a_token_runs_its_jobs_as_its_name_unless_told_otherwise():
    assert token_unix_user("alice", Role.USER, "") == "alice"
    assert token_unix_user("ci-bot", Role.USER, "alice") == "alice"
    assert token_unix_user("admin", Role.ADMIN, "root") == "root"
    assert token_unix_user("gpu-host-1", Role.WORKER, "") == ""


@pytest.mark.parametrize(
    "name,role,unix_user,says",
    [
        # a token mapped to a name that is not a Unix user name
        ("1234", Role.USER, "", "token name '1234' is not a Unix user name"),
        ("a" * 40, Role.USER, "", "is not a Unix user name"),
        ("ann", Role.USER, "Ann B", "unix_user 'Ann B' is not a Unix user name"),
        ("ann", Role.USER, "a" * 33, "is not a Unix user name"),
        # root only when an admin says so
        ("root", Role.USER, "", "would run its jobs as root: give --unix-user root"),
        ("root", Role.ADMIN, "", "would run its jobs as root"),
        ("gpu-1", Role.WORKER, "alice", "a worker token runs no jobs of its own"),
    ],
)
def test_a_token_that_would_run_as_nobody_or_root_by_accident_is_refused(
    name, role, unix_user, says
):
    with pytest.raises(Refused) as e:
        token_unix_user(name, role, unix_user)
    assert e.value.status == 400 and e.value.code == "bad_request"
    assert says in e.value.message


def _token(lab: Lab, name: str, unix_user: str, role: Role = Role.USER) -> Caller:
    secret = new_secret()
    t = lab.write(tokens.create, name, role, hash_secret(secret), "admin", None, unix_user).token
    return Caller(t.id, name, role, unix_user=t.unix_user)


def _submit(lab: Lab, who: Caller, **fields) -> int:
    fields.setdefault("selector", "*")
    req = SubmitRequest(command=("true",), **fields)
    return lab.write(
        jobs.enqueue, validate_submit(req, who, lab.ctl.cfg.limits), lab.ctl.match_cache
    )[0]


def test_every_job_records_the_unix_user_it_runs_as(lab):
    ci = _token(lab, "ci-bot", "alice")
    admin = _token(lab, "ops", "root", Role.ADMIN)
    assert lab.job(_submit(lab, ci)).unix_user == "alice"
    assert lab.job(_submit(lab, admin)).unix_user == "root"
    # --as token:NAME: the target token's principal, label and Unix user,
    # never the admin's own
    bob = _token(lab, "bob", "bob")
    as_bob = lab.job(_submit(lab, admin, as_user="token:bob"))
    assert (as_bob.submitter, as_bob.unix_user) == ("bob (token bob)", "bob")
    assert as_bob.owner == bob.principal
    as_ci = lab.job(_submit(lab, admin, as_user="token:ci-bot"))
    assert (as_ci.submitter, as_ci.unix_user, as_ci.owner) == (
        "alice (token ci-bot)",
        "alice",
        ci.principal,
    )
    # --as NAME: the Unix user of that name on the controller's host, owned by its uid
    nobody = pwd.getpwnam("nobody")
    as_nobody = lab.job(_submit(lab, admin, as_user="nobody"))
    assert (as_nobody.submitter, as_nobody.unix_user, as_nobody.owner) == (
        "nobody",
        "nobody",
        f"uid:{nobody.pw_uid}",
    )
    # the feed names the acting admin and the target
    said = lab.read(lambda tx: tx.all("events_since", (0, 0.0, 100)))
    texts = [r["text"] for r in said if r["kind"] == "submitted_as"]
    assert f"root (token ops) submitted job {as_nobody.id} as nobody (uid:{nobody.pw_uid})" in texts


def test_as_someone_this_host_does_not_know_is_refused_naming_them(lab):
    admin = _token(lab, "ops", "root", Role.ADMIN)
    _token(lab, "carol", "carol")
    with pytest.raises(Refused) as e:  # a token's name is not a Unix user's
        _submit(lab, admin, as_user="carol")
    assert e.value.status == 400
    assert e.value.message == (
        "as_user 'carol': there is no Unix user 'carol' on the controller's host; "
        "to submit as the API token of that name, give token:carol"
    )
    with pytest.raises(Refused) as e:
        _submit(lab, admin, as_user="token:nope")
    assert (e.value.status, e.value.message) == (
        400,
        "as_user token:nope: there is no live token named 'nope'",
    )
    with pytest.raises(Refused) as e:
        _submit(lab, admin, as_user="a b")
    assert e.value.status == 400 and "is not a Unix user name" in e.value.message
    user = _token(lab, "dave", "dave")
    with pytest.raises(Refused) as e:  # only an admin acts --as someone
        _submit(lab, user, as_user="token:carol")
    assert e.value.status == 403


# -- single-user workers: the planner's filter, the refusal, rc explain -------------------


def test_the_planner_gives_a_single_user_workers_devices_to_that_user_only():
    from rc.controller.planning import QueuedJob, Slot, plan
    from rc.proto.model import DeviceState

    slots = {
        "a:g0": Slot("a:g0", DeviceState.READY, run_as="alice"),
        "b:g0": Slot("b:g0", DeviceState.READY, root_ok=False),
    }
    matches = {"*": frozenset(slots)}
    queue = [
        QueuedJob(1, "bob", 0, 0.0, selector="*", unix_user="bob"),
        QueuedJob(2, "root", 0, 0.0, selector="*", unix_user="root"),
        QueuedJob(3, "alice", 0, 0.0, selector="*", unix_user="alice"),
    ]
    p = plan(queue, slots, matches, 0.0)
    assert p.assignments == [(1, ("b:g0",)), (3, ("a:g0",))]
    assert p.candidates == {1: ("b:g0",), 2: (), 3: ("a:g0", "b:g0")}


def test_a_submit_only_a_single_user_worker_could_take_is_refused_naming_it(tmp_path):
    lb = Lab(tmp_path / "data")
    try:
        lb.register("gpu-box-3", {"g0": (0, {})}, run_as="alice")
        bob = _token(lb, "bob", "bob")
        with pytest.raises(Refused) as e:
            _submit(lb, bob)
        assert e.value.code == "no_matching_device"
        assert e.value.message.startswith(
            "no device matching '*' runs jobs as bob: gpu-box-3 runs jobs as alice only ("
        )
        assert "sudo rc up -d" in e.value.message
        with pytest.raises(Refused) as e:  # pinned to it, the same
            lb.write(
                jobs.enqueue,
                validate_submit(
                    SubmitRequest(command=("true",), device_id="gpu-box-3:g0"),
                    bob,
                    lb.ctl.cfg.limits,
                ),
                lb.ctl.match_cache,
            )
        assert "no device gpu-box-3:g0 runs jobs as bob" in e.value.message
        alice = _token(lb, "alice", "alice")
        assert lb.job(_submit(lb, alice)).device_id == "gpu-box-3:g0"  # hers run
        # a shared account takes anyone's
        lb.register("gpu-box-3", {"g0": (0, {})}, run_as="alice", shared_account=True)
        assert _submit(lb, bob)
    finally:
        lb.close()


def test_root_is_refused_where_no_worker_allows_root_jobs(tmp_path):
    lb = Lab(tmp_path / "data")
    try:
        lb.register("gpu-box-2", {"g0": (0, {})})
        ops = _token(lb, "ops", "root", Role.ADMIN)
        with pytest.raises(Refused) as e:
            _submit(lb, ops)
        assert e.value.message == (
            "no device matching '*' runs jobs as root: gpu-box-2 does not run root's jobs "
            "(its worker config does not set allow_root_jobs)"
        )
        lb.register("gpu-box-2", {"g0": (0, {})}, allow_root_jobs=True)
        assert lb.job(_submit(lb, ops)).unix_user == "root"
    finally:
        lb.close()


def test_explain_says_which_worker_runs_jobs_as_someone_else(tmp_path):
    lb = Lab(tmp_path / "data")
    try:
        lb.register("box-a", {"g0": (0, {})}, run_as="alice")
        lb.register("box-b", {"g0": (0, {})})
        alice, bob = _token(lb, "alice", "alice"), _token(lb, "bob", "bob")
        busy = _submit(lb, alice, device_id="box-b:g0", selector="")
        assert lb.job(busy).device_id == "box-b:g0"
        waiting = _submit(lb, bob)
        assert lb.job(waiting).state.value == "queued"  # box-a is free, but not for bob
        got = lb.explain(waiting)
        assert got.blockers["box-a:g0"].startswith("box-a runs jobs as alice only (")
        assert got.blockers["box-b:g0"].startswith(f"alice (token alice) runs job {busy} on it")
        # the only worker that ran bob's jobs now runs one user's only
        lb.register("box-b", {"g0": (0, {})}, run_as="carol")
        got = lb.explain(waiting)
        assert got.reasons[0].startswith(
            "No device it could use runs jobs as bob: box-a runs jobs as alice only ("
        )
        assert "box-b runs jobs as carol only (" in got.reasons[0]
    finally:
        lb.close()


def test_listings_name_the_unix_user_where_it_differs_from_the_submitter():
    from rc.cli.output import job_who

    assert job_who({"submitter": "alice", "unix_user": "alice"}) == "alice"
    assert job_who({"submitter": "alice", "unix_user": "ml-svc"}) == "alice (as ml-svc)"
    assert job_who({"submitter": "alice"}) == "alice"  # a controller from before Unix users
    # a token's label names its Unix user already
    assert job_who({"submitter": "svc (token ci)", "unix_user": "svc"}) == "svc (token ci)"
