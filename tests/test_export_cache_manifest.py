"""A cache entry whose manifest is valid JSON of the wrong shape (a hand edit, a bit flip
in a value) is corrupted like any other: removed and rebuilt, never loaded, and never an
exception out of the start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.runtimes.cpu.export import ModelCache


class NoCore:
    def read_model(self, *args: str) -> object:
        raise AssertionError("a corrupted entry must not be read")


@pytest.mark.parametrize("files", [None, [], "model.xml", 3])
def test_manifest_of_the_wrong_shape_is_corrupted_not_a_crash(tmp_path: Path, files: object) -> None:
    entry = tmp_path / "k"
    entry.mkdir()
    (entry / "model.xml").write_text("<net/>")
    (entry / "model.bin").write_bytes(b"\0" * 8)
    (entry / "manifest.json").write_text(json.dumps({"key": "k", "files": files}))
    assert ModelCache(tmp_path).load("k", NoCore()) is None
    assert not entry.exists()
