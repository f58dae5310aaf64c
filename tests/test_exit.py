"""The gateway's end after a drain (gateway.cli._exit_without_teardown) is bounded: a thread still
working (a model load the shutdown could not stop) is left behind after the grace time, and every
process the gateway started, grandchildren included, is gone when it ends.

Measured with a vLLM-CPU model SIGTERMed while loading: the exit took 36 s (the load's thread was
joined) before, 7 s after, with no engine-core or worker process left (docs/operating.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = textwrap.dedent(
    """
    import multiprocessing, subprocess, sys, threading, time
    from pathlib import Path

    def child(out):
        # A worker the child starts itself (as vLLM's engine core starts its executor's worker).
        grandchild = subprocess.Popen(["sleep", "120"])
        Path(out).write_text(str(grandchild.pid))
        time.sleep(120)

    if __name__ == "__main__":
        from gateway.cli import _exit_without_teardown

        out = sys.argv[1]
        proc = multiprocessing.get_context("fork").Process(target=child, args=(out + ".grandchild",))
        proc.start()
        Path(out + ".child").write_text(str(proc.pid))
        while not Path(out + ".grandchild").exists():
            time.sleep(0.05)
        threading.Thread(target=time.sleep, args=(120,), name="model-load").start()  # not a daemon
        _exit_without_teardown(0, grace_s=0.5)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def test_exit_leaves_a_stuck_thread_behind_and_kills_every_descendant(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(_SCRIPT)
    out = str(tmp_path / "pid")
    # The stuck thread and both descendants sleep 120 s: an exit that waited for any of them
    # runs past run()'s 20 s timeout (an event, not a wall-clock margin on how fast it exited).
    done = subprocess.run(
        [sys.executable, str(script), out],
        check=False,
        capture_output=True,
        text=True,
        timeout=20,
        cwd=Path(__file__).resolve().parent.parent,
    )
    child, grandchild = int(Path(out + ".child").read_text()), int(Path(out + ".grandchild").read_text())
    try:
        assert done.returncode == 0, done.stderr
        assert "exit_abandoning_threads" in done.stdout + done.stderr
        assert "model-load" in done.stdout + done.stderr
        deadline = time.monotonic() + 5
        while (_alive(child) or _alive(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the child process outlived the gateway"
        assert not _alive(grandchild), "the child's own worker outlived the gateway"
    finally:
        for pid in (child, grandchild):
            if _alive(pid):
                os.kill(pid, 9)
