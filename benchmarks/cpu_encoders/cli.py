"""The command line: every shape asked for, then cpu_encoders.json and cpu_encoders.md."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.cpu_encoders.contestants import TORCH
from benchmarks.cpu_encoders.measure import bench_shape
from benchmarks.cpu_encoders.report import markdown
from benchmarks.harness import cpu_machine

# The package's docstring: its first line is the run's description (``--help`` shows it).
_SUITE_DOC = sys.modules[__package__].__doc__


def main() -> None:
    p = argparse.ArgumentParser(description=_SUITE_DOC.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", default="minilm,xlmr-base")
    p.add_argument("--contestants", default="", help="semicolon-separated names (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=4, help="requests per contestant, round and client count")
    p.add_argument("--agree", type=int, default=8, help="requests whose top-10 is compared")
    p.add_argument(
        "--gate", default="", help="golden set of the reduced precisions' gate, QUERIESxDOCUMENTS (default 32x30)"
    )
    p.add_argument("--baseline", default=TORCH, help="the contestant every ratio is taken against")
    p.add_argument(
        "--peers-python",
        default="",
        help="the Python whose sentence-transformers runs the peer contestants (its openvino / onnx backends)",
    )
    p.add_argument("--busy", type=int, default=0, help="CPU-bound processes running beside the timed rounds")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cpu-encoders-") as tmp:
        shapes = [bench_shape(s, args, Path(tmp)) for s in args.shapes.split(",")]
    report = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.cpu_encoders " + " ".join(sys.argv[1:]),
        "machine": cpu_machine(),
        "rounds": args.rounds,
        "shapes": shapes,
    }
    (args.out / "cpu_encoders.json").write_text(json.dumps(report, indent=2))
    (args.out / "cpu_encoders.md").write_text(markdown(report))
    print(markdown(report))
