"""Routes on the fleet: devices, describe, explain, state; admin verbs
clear, retire, drain, undrain."""

from __future__ import annotations

import dataclasses

from starlette.requests import Request

from rc.controller.api import caller, ctl, free_text, json_body, query_bool, reply
from rc.controller.errors import Refused
from rc.controller.scans import refuse_incomplete, scan_answer, survivors_text
from rc.controller.store import devices, jobs, views
from rc.proto.errors import ErrorCode
from rc.proto.wire import ActionResult, DeviceList

__all__ = [
    "clear",
    "describe",
    "drain",
    "explain",
    "health_unclean",
    "list_devices",
    "retire",
    "state",
    "undrain",
]


async def list_devices(request: Request):
    """GET /v1/devices[?labels=false]: every device with who holds it; without
    labels when asked (the `rc devices` table does not show them, and a
    1,000-device fleet's labels are most of the reply)."""
    c = ctl(request)
    with_labels = query_bool(request, "labels", True)
    return reply(DeviceList(tuple(await c.db.read(views.device_views, with_labels))))


async def describe(request: Request):
    """GET /v1/devices/{id}/describe: labels with source and age, sheet, recent jobs."""
    c = ctl(request)
    who = caller(request)
    info = await c.db.read(views.describe, request.path_params["device_id"])
    recent = tuple(views.for_caller(j, who) for j in info.recent_jobs)
    return reply(dataclasses.replace(info, recent_jobs=recent))


async def explain(request: Request):
    """GET /v1/explain?selector=S: matching devices, free ones, queue depth."""
    c = ctl(request)
    text = request.query_params.get("selector", "")
    if not text:
        raise Refused(ErrorCode.BAD_SELECTOR, "give a selector (?selector=...)")
    return reply(await c.db.read(views.explain_selector, text, c.policy))


async def state(request: Request):
    """GET /v1/state: devices, active jobs, the queue in scheduling order."""
    c = ctl(request)
    who = caller(request)
    st = await c.db.read(views.state, c.policy)
    watched = await c.db.read(jobs.idle_watched)
    return reply(
        dataclasses.replace(
            st,
            jobs=tuple(views.for_caller(j, who) for j in st.jobs),
            queued=tuple(views.for_caller(j, who) for j in st.queued),
            holds_idle={
                str(w.hold_id): c.idle_state(w.hold_id, w.started_at, w.timeout) for w in watched
            },
        )
    )


async def clear(request: Request):
    """POST /v1/devices/{id}/clear (admin): return a quarantined device to the
    pool once its worker's fresh survivor scan found nothing
    (rc.controller.scans).

    409 survivors_found naming each process (the device stays out); with
    `kill` the worker ends them and scans again first. 503 scan_unavailable
    when the worker is not connected, does not answer within SCAN_WAIT_S or
    cannot scan. A GPU health fault (rc.worker.health) is cleared only when
    the scan's fresh health reading shows the rule that faulted it clean
    (health_unclean); its answer comes before the survivors': 409
    device_not_cleared while the GPU has a fault, cannot read that rule's
    fact, or cannot be read at all (nvidia-smi failing). A cleared health
    fault sets the `health` label to the fresh reading. `force` clears
    without a scan; its event says forced.
    404/409 device_not_cleared as store.devices.clear.
    """
    c = ctl(request)
    who = caller(request)
    device_id = request.path_params["device_id"]
    req = await json_body(request, c.cfg.limits.body_bytes, empty_ok=True)
    job_ids = await c.db.read(devices.clearable, device_id)
    if req.force:
        await c.db.write(devices.clear, device_id, who.name, "forced, without a survivor scan")
        return reply(ActionResult(True, f"cleared {device_id} (forced, without a survivor scan)"))
    host = device_id.rpartition(":")[0]
    result = await scan_answer(c, host, (device_id,), job_ids, req.kill, device_id)
    rule = await c.db.read(devices.health_fault, device_id)
    now = ""
    if rule and not result.error:
        now = _reading_clean(
            device_id,
            rule,
            result,
            "reset the GPU or reboot the host, then rc clear again (or rc clear --force)",
        )
    refuse_incomplete(result, host, device_id)
    if result.survivors:
        raise Refused(
            ErrorCode.SURVIVORS_FOUND,
            f"{device_id} is not empty: {survivors_text(result.survivors)}; the device stays "
            f"out (rc clear --kill {device_id} ends them)",
        )
    proof = "a survivor scan found nothing"
    if now:
        proof += f" and its GPU reads {now} again"
    if result.ended:
        proof = f"ended {survivors_text(result.ended)}, then {proof}"
    await c.db.write(devices.clear, device_id, who.name, proof, now.split(" ")[0], c.match_cache)
    return reply(ActionResult(True, f"cleared {device_id}: {proof}"))


def health_unclean(rule: str, now: str) -> str:
    """Why a GPU's fresh reading `now` (rc.worker.health.proof_status:
    "fault:a+b unknown:c", "ok", or "unreadable") does not prove `rule` (the
    health rule, or rules joined by "+", that took the device out) clean, in
    words; "" when it does. Never clean: a GPU nvidia-smi cannot read, one
    with any fault, one whose reading has the rule in any part (an unknown
    fact is not a clean one)."""
    if now == "unreadable":
        return (
            "nvidia-smi cannot read the GPU at all, so nothing shows that "
            f"{rule}, which took it out, is gone"
        )
    parts = dict(p.partition(":")[::2] for p in now.split(" ") if p)
    names = {k: set(v.split("+")) for k, v in parts.items()}
    rules = set(rule.split("+"))
    if rules & names.get("fault", set()):
        return f"the fault that took it out ({rule}) is still there"
    if "fault" in names:
        return f"it has a fault ({parts['fault']})"
    if rules & names.get("unknown", set()):
        return (
            f"the GPU could not be read for {rule}, the rule that took it out: "
            "a fact that cannot be read is never clean"
        )
    for kind in ("drain", "degraded"):
        if rules & names.get(kind, set()):
            return f"{rule}, which took it out, is still there"
    return ""


async def retire(request: Request):
    """DELETE /v1/devices/{id} (admin): remove a device; job history stays."""
    c = ctl(request)
    who = caller(request)
    device_id = request.path_params["device_id"]
    await c.db.write(devices.retire, device_id, who.name, c.match_cache)
    return reply(
        ActionResult(
            True,
            f"retired {device_id}; a worker that still declares it "
            "brings it back at its next registration",
        )
    )


async def drain(request: Request):
    """POST /v1/devices/{id}/drain (admin): the current job finishes, no new one
    starts. Draining a draining device is 200 with already=true and changes
    nothing, unless it brings a new reason (store.devices.drain)."""
    c = ctl(request)
    who = caller(request)
    device_id = request.path_params["device_id"]
    req = await json_body(request, c.cfg.limits.body_bytes, empty_ok=True)
    message, already = await c.db.write(
        devices.drain,
        device_id,
        True,
        free_text("the drain reason", req.reason, c.cfg.limits.text_bytes),
        who.name,
    )
    return reply(ActionResult(True, message, already))


async def undrain(request: Request):
    """POST /v1/devices/{id}/undrain (admin): schedulable again; 200 with
    already=true for a device that is not draining. A device a GPU health
    rule drained (its reason says `health: RULE ...`) is undrained only when
    its worker's fresh reading (the survivor scan's re-probe, as rc clear's)
    shows the rule clean (health_unclean): 409 device_not_cleared naming the
    rule while it is not, 503 scan_unavailable when the worker cannot be
    asked. `force` undrains without the re-probe; its event says forced.
    """
    c = ctl(request)
    who = caller(request)
    device_id = request.path_params["device_id"]
    req = await json_body(request, c.cfg.limits.body_bytes, empty_ok=True)
    rule = await c.db.read(devices.health_drain, device_id)
    note = ""
    if rule and req.force:
        note = "forced, without a health re-probe"
    elif rule:
        host = device_id.rpartition(":")[0]
        result = await scan_answer(c, host, (device_id,), (), False, device_id, UNDRAIN_HINT)
        if result.error:
            raise Refused(
                ErrorCode.SCAN_UNAVAILABLE,
                f"the worker of {host} could not re-probe {device_id}: {result.error}"
                + UNDRAIN_HINT,
            )
        now = _reading_clean(
            device_id,
            rule,
            result,
            "it stays drained: reset the GPU, then rc undrain again (or rc undrain --force "
            f"{device_id})",
        )
        note = f"its GPU reads {now} again (re-probed just now)"
    message, already = await c.db.write(devices.drain, device_id, False, note, who.name)
    if note and not already:
        message += f" ({note})"
    return reply(ActionResult(True, message, already))


UNDRAIN_HINT = " (rc undrain --force undrains a device without the health re-probe)"


def _reading_clean(device_id: str, rule: str, result, then: str) -> str:
    """The device's fresh health reading from a re-probe (`result`, a
    ScanResult; "unreadable" when it has none). Raises Refused 409
    device_not_cleared, ending with `then` (what to do), while the health
    rule `rule` that took the device out does not read clean in it."""
    now = result.health.get(device_id, "unreadable")
    why = health_unclean(rule, now)
    if why:
        raise Refused(
            ErrorCode.DEVICE_NOT_CLEARED,
            f"{device_id} still reads {now} (re-probed just now): {why}; {then}",
        )
    return now
