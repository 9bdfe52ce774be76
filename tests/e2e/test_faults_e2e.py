"""The bounded subset of bench/faults.py that CI runs (tests/helpers/faults.py
CI_SCENARIOS): each fault healed with nothing acknowledged lost, nothing run
twice, no busy device handed out and no log byte lost."""

from __future__ import annotations

import pytest

from tests.helpers.faults import CI_SCENARIOS, SCENARIOS, table


@pytest.mark.parametrize("name", CI_SCENARIOS)
def test_a_healed_fault_loses_nothing(name, tmp_path, pyz):
    out = SCENARIOS[name](tmp_path, pyz)
    print("\n" + table([out]))
    assert out.jobs > 0
    assert out.clean(), (table([out]), out.states, out.note)
