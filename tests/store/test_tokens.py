"""Revoking a token: the queued jobs it owns (its principal, never a
name's) are cancelled unless kept, and the in-memory token map follows each
change without being rebuilt."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rc.controller.auth import TokenCache, hash_secret, new_secret
from rc.controller.errors import Refused
from rc.controller.store import jobs, tokens
from rc.controller.store.rows import LiveToken
from rc.controller.submission import validate_submit
from rc.proto.model import JobKind, JobState, Role, Token
from rc.proto.wire import SubmitRequest
from tests.helpers.inprocess import Lab


@pytest.fixture
def lab(tmp_path, engine):
    """A Lab on each store engine (the engine fixture, tests/conftest.py)."""
    lb = Lab(tmp_path / "data")
    yield lb
    lb.close()


def test_revoke_cancels_the_queued_jobs_the_token_owns_and_no_others(lab):
    """Found by a new user: revoking a token left its owner's queued jobs to
    run. Found in a lab trial: revoking token alice cancelled the jobs the
    Unix user alice queued through the socket (names were compared)."""
    lab.register("box", {"g0": (0, {})}, allow_root_jobs=True)
    alice, bob = lab.token("alice"), lab.token("bob")
    ops = lab.token("ops", Role.ADMIN, "root")
    running, _ = lab.submit(alice)  # takes the one device
    assert lab.job(running).state is JobState.ASSIGNED
    hold = lab.submit(alice, kind=JobKind.HOLD, max_runtime_seconds=60, reason="r")[0]
    queued = [lab.submit(alice)[0], hold]
    # an admin's job submitted as the token alice is the token's too
    as_alice = validate_submit(
        SubmitRequest(command=("true",), selector="*", as_user="token:alice"),
        ops,
        lab.ctl.cfg.limits,
    )
    queued.append(lab.write(jobs.enqueue, as_alice, lab.ctl.match_cache)[0])
    bobs, _ = lab.submit(bob)
    # the local user alice (the socket's uid principal) is someone else
    socket_alice, _ = lab.submit("alice")
    assert lab.job(socket_alice).owner.startswith("uid:")
    # so is the Unix user an admin submits --as (owned by its uid)
    as_unix = validate_submit(
        SubmitRequest(command=("true",), selector="*", as_user="nobody"),
        ops,
        lab.ctl.cfg.limits,
    )
    unix_job = lab.write(jobs.enqueue, as_unix, lab.ctl.match_cache)[0]
    _hash, cancelled = lab.write(tokens.revoke, "alice", "admin")
    assert cancelled == sorted(queued)
    for j in queued:
        got = lab.job(j)
        assert (got.state, got.kill_reason) == (JobState.KILLED, tokens.REVOKED_REASON)
    assert lab.job(running).state is JobState.ASSIGNED  # running ones go on
    assert lab.job(bobs).state is JobState.QUEUED
    assert lab.job(socket_alice).state is JobState.QUEUED
    assert lab.job(unix_job).state is JobState.QUEUED
    # --keep-jobs: bob's queued job stays queued
    assert lab.write(tokens.revoke, "bob", "admin", True)[1] == []
    assert lab.job(bobs).state is JobState.QUEUED
    with pytest.raises(Refused) as e:
        lab.write(tokens.revoke, "alice", "admin")
    assert e.value.status == 404
    # a token made again under the same name is a new principal: it owns
    # none of the revoked one's jobs, and its revoke cancels only its own
    again = lab.token("alice")
    assert again.principal != alice.principal
    fresh, _ = lab.submit(again)
    assert lab.write(tokens.revoke, "alice", "admin")[1] == [fresh]
    assert lab.job(socket_alice).state is JobState.QUEUED


def test_a_rotated_token_is_the_same_principal_with_a_new_secret(lab):
    """Found with principals: `rc up` rewriting a lost client config revoked
    the user's token and made one of the same name, a new principal, so
    `rc logs` of the user's own job said not_job_owner. A rotation keeps the
    token's id (its principal), so its jobs stay its own; only the secret
    changes, and the old one is refused."""
    lab.register("box", {"g0": (0, {})})
    alice = lab.token("alice")
    mine, _ = lab.submit(alice)
    old = lab.run(lab.ctl.db.read(lambda tx: tx.one("token_live_by_name", ("alice",))))
    old_hash, new = lab.write(tokens.rotate, "alice", hash_secret(new_secret()), "admin")
    assert old_hash == old["secret_hash"] != new.secret_hash
    assert new.token.id == old["id"] and new.token.unix_user == "alice"
    assert lab.job(mine).owner == f"token:{new.token.id}"
    with pytest.raises(Refused) as e:
        lab.write(tokens.rotate, "nobody-here", hash_secret(new_secret()), "admin")
    assert e.value.status == 404


def test_the_token_map_follows_each_change_in_place():
    """Found reading the code: each token create rebuilt the whole map (O(n))."""
    cache = TokenCache()
    token = Token(name="a", role=Role.USER, created_at=0.0, unix_user="a", id=1)
    cache.load(LiveToken(replace(token, id=i, name=f"t{i}"), f"h{i}") for i in range(3))
    assert len(cache) == 3
    secret = new_secret()
    cache.put(LiveToken(replace(token, id=9, name="new"), hash_secret(secret)))
    assert len(cache) == 4
    assert cache.authenticate(f"Bearer {secret}", 0.0).name == "new"
    cache.drop(hash_secret(secret))
    assert len(cache) == 3
    with pytest.raises(Refused) as e:
        cache.authenticate(f"Bearer {secret}", 0.0)
    assert e.value.status == 401
    cache.drop("not-there")  # ignored
    assert len(cache) == 3
