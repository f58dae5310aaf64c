"""The command line of ``python -m benchmarks.reliability``: the sections picked by ``--only``, a
report written after each, and ``audit`` (pip-audit of an installed environment, ``audit.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from benchmarks.reliability.failover import failover
from benchmarks.reliability.processes import ROOT
from benchmarks.reliability.report import _write
from benchmarks.reliability.sections import (
    SECTIONS,
    engine_kill,
    redis_faults,
    sigterm,
    soak,
    upstream,
)

# The package's docstring is the suite's description (``--help`` shows it).
_SUITE_DOC = sys.modules[__package__].__doc__


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["audit"]:  # pip-audit where PyPI serves only the latest-release JSON (audit.py)
        from benchmarks.reliability.audit import main as audit_main

        return audit_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.reliability",
        description=_SUITE_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--soak-s", type=float, default=120.0)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--out", default=str(ROOT / "docs" / "reliability"))
    parser.add_argument(
        "--engine-window-s",
        type=float,
        default=420.0,
        help="engine section: longest wait for the first 200 after the kill",
    )
    parser.add_argument("--keep-logs", default=None, help="copy the engine section's gateway log into this folder")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    now = datetime.now(UTC)
    report: dict[str, Any] = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()} (shared with other jobs)",
        "command": "python -m benchmarks.reliability " + " ".join(argv),
    }
    out = Path(args.out) / now.strftime("%Y-%m-%d")
    with tempfile.TemporaryDirectory(prefix="reliability-") as tmp:
        workdir = Path(tmp)
        steps = {
            "soak": lambda: soak(workdir, args.clients, args.soak_s),
            "upstream": lambda: upstream(workdir, max(2, args.clients // 2)),
            "failover": lambda: failover(workdir, args.clients),
            "redis": lambda: redis_faults(workdir, max(2, args.clients // 2)),
            "sigterm": lambda: sigterm(workdir),
            "engine": lambda: engine_kill(
                workdir, 4, args.engine_window_s, Path(args.keep_logs) if args.keep_logs else None
            ),
        }
        for name in SECTIONS:
            if name not in only:
                continue
            print(f"[{datetime.now(UTC):%H:%M:%S}] {name} ...", flush=True)
            try:
                report[name] = steps[name]()
            except Exception as exc:  # a section that cannot run is reported, not fatal  # noqa: BLE001
                report[name] = {"skipped": f"{type(exc).__name__}: {exc}"}
            report.setdefault("section_dates", {})[name] = f"{datetime.now(UTC):%H:%M} UTC"
            print(json.dumps(report[name], default=str)[:600], flush=True)
            _write(report, out)  # after every section: a run stopped early keeps what it measured
    print(f"wrote {out}/reliability.json and reliability.md")
    return 0
