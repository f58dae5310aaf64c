"""The targets' process trees as /proc shows them: descendants, CPU while idle, voluntary context
switches, signals to the whole tree (SIGSTOP / SIGCONT of the targets not measured), load average.
"""

from __future__ import annotations

import collections
import os
import re
import time
from pathlib import Path

from benchmarks.passthrough_wrk.overhead import Proc


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's workers, LiteLLM's children) from /proc."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _switches(proc: Proc) -> int:
    """Voluntary context switches of every thread of the process tree: how often it went to sleep
    (waiting for a socket, another thread, the GIL). One client's request costs a wake-up per sleep."""
    total = 0
    for pid in _tree(proc.proc.pid):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                status = (task / "status").read_text()
            except OSError:
                continue
            m = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.MULTILINE)
            total += int(m.group(1)) if m else 0
    return total


def _signal_tree(proc: Proc, sig: int) -> None:
    for pid in _tree(proc.proc.pid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _idle_cpu(procs: dict[str, Proc], seconds: float = 3.0) -> dict[str, float]:
    """Share of a core each target uses while nobody sends it anything."""
    before = {n: p.cpu_s() for n, p in procs.items()}
    time.sleep(seconds)
    return {n: round((p.cpu_s() - before[n]) / seconds, 4) for n, p in procs.items()}
