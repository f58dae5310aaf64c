"""The response's order: descending score, ties by index, cut to top_n -- by heap or by sort alike."""

from __future__ import annotations

import random

from gateway.serving.service import rank_order


def test_heap_and_sort_give_the_same_order_ties_by_index() -> None:
    rng = random.Random(0)
    for n in (1, 7, 100, 1000):
        scores = [rng.choice([0.0, 0.25, 0.5, 1.0]) if rng.random() < 0.5 else rng.random() for _ in range(n)]
        full = sorted(range(n), key=lambda i: (-scores[i], i))
        for top_n in {1, 3, n // 8, n // 2, n}:
            if top_n >= 1:
                assert rank_order(scores, top_n) == full[:top_n], (n, top_n)
    assert rank_order([0.5, 0.9, 0.5, 0.9] + [0.0] * 40, 3) == [1, 3, 0]
