"""The GPU suite's planted bugs (tests/gpu/planted.py) still apply to today's source.

Each is an edit of a text in a source file; a reformat that changed that text left the first H200
run (2026-12-05) stopping at once ("the text to change is no longer in step.py"): a wasted device
call. Checked here, on the CPU, where CI runs -- by reading, not applying: the files stay as they are
for any test running beside this one."""

from __future__ import annotations

import pytest

from tests.gpu import planted


@pytest.mark.parametrize("name", sorted(planted.PLANTED))
def test_every_planted_bug_still_finds_its_text(name: str) -> None:
    for rel, old, new in planted.PLANTED[name]:
        text = (planted.ROOT / rel).read_text(encoding="utf-8")
        assert old in text, f"{rel} no longer holds the text bug {name!r} edits: update tests/gpu/planted.py"
        assert old != new and new not in text
