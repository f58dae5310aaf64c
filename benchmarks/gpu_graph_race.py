"""Does eager work on a CUDA graph's capture stream corrupt that graph's replays on another stream?

    python3 -m benchmarks.gpu_graph_race [--out DIR]      # on a CUDA machine, ~20 s

Why this exists: the packed encoder engine captured its step graphs on a stream of their own and
ran each (pairs, max length) class's first step eagerly on that same stream, while earlier
graphs replayed on the main stream. cuBLAS keeps a workspace per (handle, stream) in PyTorch, and
a graph's GEMMs keep the capture stream's workspace, so an eager GEMM on the capture stream and a
replay on the main stream may write one workspace at the same time. Under 16 clients on the H200
(about 30 captures a run) some steps came back with non-finite logits (reports gpu-h200-2026-12-02-c
and -d); none did with 5 captures.

This replays one graph (six XLM-R large MLP blocks on 15,000 tokens, bf16: the GELU in the
cuBLASLt epilogue, as the engine's MLP) while the same blocks run eagerly on another input, on
(a) no stream, (b) an unrelated stream, (c) the graph's capture stream; each replay's output is
compared bit for bit with a replay alone. Writes ``graph_race.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

TOKENS, HIDDEN, MLP, BLOCKS = 15_000, 1_024, 4_096, 6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--replays", type=int, default=200, help="per variant")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    bf = {"device": dev, "dtype": torch.bfloat16}
    w1, b1 = torch.randn(MLP, HIDDEN, **bf) * 0.03, torch.randn(MLP, **bf) * 0.02
    w2, b2 = torch.randn(HIDDEN, MLP, **bf) * 0.015, torch.randn(HIDDEN, **bf) * 0.02

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(BLOCKS):
            a = torch._addmm_activation(b1, h, w1.t(), use_gelu=True)  # cuBLASLt, GELU epilogue
            h = torch.nn.functional.layer_norm(h + torch.addmm(b2, a, w2.t()), (HIDDEN,))
        return h[:256].float()

    x, y = torch.randn(TOKENS, HIDDEN, **bf), torch.randn(TOKENS - 1_000, HIDDEN, **bf)
    main_stream, cap, other = torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream()
    cap.wait_stream(main_stream)
    with torch.cuda.stream(cap):  # warm-up on the capture stream, as PyTorch's docs (and the engine) did
        forward(x)
    cap.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(cap):
        graph.capture_begin()
        out = forward(x)
        graph.capture_end()
    main_stream.wait_stream(cap)
    graph.replay()
    torch.cuda.synchronize()
    ref = out.clone()
    with torch.cuda.stream(other):  # the unrelated stream's own workspace exists before the timed loop
        forward(y)
    torch.cuda.synchronize()

    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "tokens": TOKENS, "blocks": BLOCKS, "replays": args.replays, "variants": {}}
    for name, stream in (("alone", None), ("eager on another stream", other), ("eager on the capture stream", cap)):
        differ = nonfinite = 0
        worst = 0.0
        t0 = time.perf_counter()
        for _ in range(args.replays):
            if stream is not None:
                stream.wait_stream(main_stream)
                with torch.cuda.stream(stream):
                    forward(y)  # queued first: runs beside the replay below
            graph.replay()
            got = out.clone()  # right behind the replay, on its stream (as the engine copies its logits)
            torch.cuda.synchronize()
            if not torch.equal(got, ref):
                differ += 1
                nonfinite += int(not torch.isfinite(got).all())
                worst = max(worst, float(torch.nan_to_num((got - ref).abs(), nan=float("inf")).max()))
        results["variants"][name] = {"replays_differing": differ, "replays_nonfinite": nonfinite,
                                     "worst_abs_diff": worst, "wall_s": round(time.perf_counter() - t0, 2)}
        print(name, json.dumps(results["variants"][name]), flush=True)
    # The engine now: warm-up on the main stream, a capture stream that never ran anything (its
    # cuBLAS workspace is made inside the capture, in the graph's pool); eager work and replays
    # then share the main stream, one after the other.
    cap2 = torch.cuda.Stream()
    forward(x)
    torch.cuda.synchronize()
    graph2 = torch.cuda.CUDAGraph()
    cap2.wait_stream(main_stream)
    with torch.cuda.stream(cap2):
        graph2.capture_begin()
        out2 = forward(x)
        graph2.capture_end()
    main_stream.wait_stream(cap2)
    differ = 0
    for _ in range(args.replays // 4):
        forward(y)
        graph2.replay()
        got = out2.clone()
        torch.cuda.synchronize()
        differ += int(not torch.equal(got, ref))
    results["variants"]["warm-up on the main stream, capture on a fresh stream"] = {
        "replays_differing_from_the_first_graph": differ, "replays": args.replays // 4}
    print("fresh capture stream", differ, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "graph_race.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
