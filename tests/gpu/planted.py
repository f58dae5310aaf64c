"""Planted bugs the GPU suite must catch, and the device run that shows it does.

    python -m tests.gpu.planted run      # on the GPU machine, from the repository root

runs ``pytest -m gpu tests/gpu`` on the tree as it is (must pass), then once per planted bug with
that bug applied (must fail), restoring each file afterwards; logs and a summary go to ``$OUT``
(else ``gpu-suite-out/``). Exit 0 only when the clean run passed and every planted run failed.

The bugs are edits of the source text (no ``git`` or ``patch`` needed on a bare machine), each a
mistake the CPU tests cannot see:

- ``varlen-offsets``: every boundary between the sequences of a packed step one token early in
  ``cu_seqlens`` (``step.pack``). The CPU's per-prompt SDPA reads host lengths, not the offsets.
- ``fp8-triton-scales``: the Triton quantizing kernels store twice the scale they quantized with.
  The CPU has no Triton regions; on CUDA the picker refuses such a kernel, which the suite must
  notice (it requires the Triton family to be the one serving).
- ``fp8-weight-scales``: every FP8 weight's per-channel scales doubled (``fp8_gemm.quantize_weight``),
  on every device: the scores the suite compares must move.
- ``fp8-encoder-triton-scales``: the cross-encoders' Triton LayerNorm / activation kernels
  (``encoder_fp8_triton``) store twice the scale they quantized with. The picker refuses them on
  CUDA and the compiled regions serve; the suite must notice (it requires the Triton ones to serve).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name -> [(file, text as it is, text with the bug)]
PLANTED: dict[str, list[tuple[str, str, str]]] = {
    "varlen-offsets": [
        (
            "adapters/runtimes/packed/step.py",
            "    np.cumsum(lens, out=arr[o + 1 : o + 1 + n_seq])\n    o += n_seq + 1\n",
            "    np.cumsum(lens, out=arr[o + 1 : o + 1 + n_seq])\n    arr[o + 1 : o + n_seq] -= 1\n    o += n_seq + 1\n",
        )
    ],
    "fp8-triton-scales": [
        (
            "adapters/runtimes/packed/fp8_triton.py",
            "    tl.store(S + row, scale)\n",
            "    tl.store(S + row, scale * 2.0)\n",
        )
    ],
    "fp8-encoder-triton-scales": [
        (
            "adapters/runtimes/packed/encoder_fp8_triton.py",
            "    tl.store(S + row, scale)\n",
            "    tl.store(S + row, scale * 2.0)\n",
        )
    ],
    "fp8-weight-scales": [
        (
            "adapters/runtimes/packed/fp8_gemm.py",
            "    return Fp8Weight(q.t(), s.t().contiguous())\n",
            "    return Fp8Weight(q.t(), (2 * s).t().contiguous())\n",
        )
    ],
}


def apply(name: str) -> dict[Path, str]:
    """Plant bug ``name``; returns the files' original texts (for :func:`restore`)."""
    saved: dict[Path, str] = {}
    for rel, old, new in PLANTED[name]:
        path = ROOT / rel
        current = path.read_text(encoding="utf-8")
        saved.setdefault(path, current)  # the text before this bug's first edit of the file
        if old not in current:
            restore(saved)
            raise SystemExit(
                f"planted bug {name!r}: the text to change is no longer in {rel}; update tests/gpu/planted.py"
            )
        path.write_text(current.replace(old, new), encoding="utf-8")  # every occurrence
    return saved


def restore(saved: dict[Path, str]) -> None:
    for path, text in saved.items():
        path.write_text(text, encoding="utf-8")


def _pytest(out: Path, label: str) -> tuple[int, float]:
    started = time.monotonic()
    with (out / f"{label}.log").open("w", encoding="utf-8") as log:
        rc = subprocess.call(
            [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-x", "-p", "no:cacheprovider", "-rs"],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return rc, time.monotonic() - started


def run() -> int:
    out = Path(os.environ.get("OUT") or ROOT / "gpu-suite-out")
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, object] = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        import torch

        summary["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
        summary["torch"] = torch.__version__
    except ImportError:
        summary["device"] = "no torch"
    rc, took = _pytest(out, "clean")
    summary["clean"] = {"exit": rc, "seconds": round(took, 1), "passed": rc == 0}
    ok = rc == 0
    for name in PLANTED:
        saved = apply(name)
        try:
            rc, took = _pytest(out, f"planted-{name}")
        finally:
            restore(saved)
        caught = rc == 1  # tests failed (not: collection error, no tests, interrupted)
        summary[name] = {"exit": rc, "seconds": round(took, 1), "caught": caught}
        ok = ok and caught
    summary["ok"] = ok
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(json.dumps(summary, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] != ["run"]:
        raise SystemExit(__doc__)
    raise SystemExit(run())
