"""``rerank-gateway bench`` sweeps: each load level sends bodies no earlier level sent.

A level that re-sends the previous level's exact requests is answered from whatever the server
kept of them (vLLM's prefix cache, on by default for LLM rerankers; the response cache): the
later levels' docs/s and latency would be a cache's, not the model's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from gateway.bench import command, driver


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    # A bare host means its /v2/rerank, which bench refuses to call without a model.
    return parser.parse_args(
        [
            "bench",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--requests",
            "4",
            "--documents",
            "3",
            "--warmup",
            "0",
            "--no-progress",
            "--no-plot",
            "--out",
            str(tmp_path / "out"),
            *extra,
        ]
    )


def test_each_concurrency_level_gets_fresh_bodies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[list[bytes]] = []

    async def fake_closed(
        ep: driver.Endpoint, *, concurrency: int, total: int, timeout: float, progress: Any = None
    ) -> driver.LevelRun:
        seen.append([r.body for r in driver._cycle(ep.requests, total)])
        return driver.LevelRun(endpoint=ep.label, mode="closed", concurrency=concurrency, wall_s=1.0)

    monkeypatch.setattr(driver, "run_closed", fake_closed)
    args = _args(tmp_path, "--concurrency", "1,4,16")
    args.func(args, [])
    assert len(seen) == 3
    for i in range(3):
        assert len(set(seen[i])) == 4
        for j in range(i):
            assert not set(seen[i]) & set(seen[j]), f"level {i} re-sends level {j}'s requests"


def test_compare_levels_get_fresh_bodies_and_both_endpoints_the_same(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[list[bytes], list[bytes]]] = []

    async def fake_compare(
        a: driver.Endpoint,
        b: driver.Endpoint,
        *,
        concurrency: int,
        total: int,
        round_size: int,
        timeout: float,
        progress: Any = None,
    ) -> tuple[driver.LevelRun, driver.LevelRun]:
        seen.append(([r.body for r in a.requests], [r.body for r in b.requests]))
        return (
            driver.LevelRun(endpoint=a.label, mode="closed", concurrency=concurrency, wall_s=1.0),
            driver.LevelRun(endpoint=b.label, mode="closed", concurrency=concurrency, wall_s=1.0),
        )

    monkeypatch.setattr(driver, "run_compare", fake_compare)
    args = _args(tmp_path, "--concurrency", "1,2", "--compare", "http://127.0.0.1:10", "--compare-model", "m")
    args.func(args, [])
    (a1, b1), (a2, b2) = seen
    assert a1 == b1 and a2 == b2  # the same model on both sides: the very same bodies
    assert not set(a1) & set(a2)
