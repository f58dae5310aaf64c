"""The parity gate must not admit a reduced precision whose scores are NaN. Sorting by a
NaN key leaves the order as it was, so a NaN top document looked "kept" and the NaN vanished from
the largest score change."""

from __future__ import annotations

import math

import pytest

from adapters.runtimes.parity import compare_rankings, keeps_top_k


@pytest.mark.parametrize("where", [0, 5, 11])
def test_a_nan_score_is_a_change_not_a_kept_order(where: int) -> None:
    ref = [float(12 - i) for i in range(12)]
    red = list(ref)
    red[where] = math.nan
    assert not keeps_top_k(ref, red, tie=1e-3)
    report = compare_rankings([ref], [red], tie=1e-3)
    assert report.kept == 0
    assert report.max_delta == math.inf
