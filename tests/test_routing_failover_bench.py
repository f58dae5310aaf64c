"""The reliability run's ``failover`` section, small: it runs end to end against real processes
and reports what the dated report shows (0 errors, each phase's target, the primary preferred again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.reliability.failover import failover
from benchmarks.reliability.report import _md


@pytest.mark.slow
def test_the_failover_section_measures_a_chain_through_its_primarys_death(tmp_path: Path) -> None:
    result = failover(tmp_path, clients=4, healthy_s=1.5, down_s=3.0, after_s=6.0)
    assert result["errors"] == 0, result
    dead = result["primary_dead"]["served_by"]  # (a request sent as the kill landed may still be the primary's)
    assert dead.get("fallback", 0) > 10 * dead.get("primary", 0), dead
    assert result["after_restart"]["served_by"].get("primary", 0) > 0
    assert result["preferred_again_s"] is not None and result["preferred_again_s"] >= 0
    report = _md({"date": "d", "machine": "m", "command": "c", "failover": {**result}})
    assert "primary preferred again" in report
