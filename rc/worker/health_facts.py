"""The GPU facts a health pass reads from nvidia-smi (README "GPU health").

`nvidia-smi --query-gpu=HEALTH_FIELDS --format=csv,noheader,nounits`, per
GPU. A field this nvidia-smi does not know is dropped from the query (it
reads unknown from then on); a value it cannot read ("[N/A]", "[Not
Supported]", an error) is None. The parser is a pure function over the text
nvidia-smi prints (`parse_readings`); `Query` keeps the fields between
passes.
"""

from __future__ import annotations

import logging
import re

from rc.worker import nvidia

__all__ = ["HEALTH_FIELDS", "Query", "parse_readings"]

log = logging.getLogger("rc.worker.health")

HEALTH_FIELDS = (
    "index",
    "pci.bus_id",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "retired_pages.pending",
    "clocks_throttle_reasons.hw_slowdown",
    "clocks_throttle_reasons.hw_thermal_slowdown",
    "clocks_throttle_reasons.hw_power_brake_slowdown",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "temperature.gpu",
    "power.draw",
    "utilization.gpu",
)
"""The --query-gpu fields of a health pass, in this order."""
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


def parse_readings(text: str, fields: tuple[str, ...]) -> dict[int, dict[str, str | None]]:
    """Parse --query-gpu=FIELDS CSV (noheader, nounits): {GPU index: {field:
    value}}, a value nvidia-smi could not read being None. `fields` must
    start with "index"; a line with the wrong number of values is skipped."""
    out: dict[int, dict[str, str | None]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields) or not parts[0].isdigit():
            continue
        out[int(parts[0])] = {
            f: (p if p.lower() not in nvidia.UNAVAILABLE else None)
            for f, p in zip(fields, parts, strict=True)
        }
    return out


class Query:
    """nvidia-smi's health query for one worker process: the fields it
    accepts (`fields`, HEALTH_FIELDS less those it refused). Not
    thread-safe."""

    def __init__(self) -> None:
        self.fields = HEALTH_FIELDS
        self.unanswered = False
        """Whether the last read failed because nvidia-smi did not answer in time."""

    def read(self) -> dict[int, dict[str, str | None]] | None:
        """The readings (parse_readings), dropping fields this nvidia-smi
        does not know (they read unknown); None when nvidia-smi fails."""
        self.unanswered = False
        for _ in range(len(HEALTH_FIELDS)):
            try:
                out = nvidia._run(f"--query-gpu={','.join(self.fields)}", nvidia.TIMEOUT_S)
            except nvidia.NvidiaTimeout as e:
                log.warning("health query: %s", e)
                self.unanswered = True
                return None
            except nvidia.NvidiaError as e:
                bad = _INVALID_FIELD.search(str(e))
                if bad is None or bad.group(1) not in self.fields or bad.group(1) == "index":
                    log.debug("health query failed: %s", e)
                    return None
                log.warning("nvidia-smi does not know %s; it reads unknown", bad.group(1))
                self.fields = tuple(f for f in self.fields if f != bad.group(1))
                continue
            return parse_readings(out, self.fields)
        return None
