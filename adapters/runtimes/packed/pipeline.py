"""``split = "pipeline"``: one model's layers divided over several devices, stage after stage.

Stage ``s`` holds a contiguous range of the decoder layers (the first also the embeddings, the
last also the final norm and the two head rows). A step runs stage 0 on its device, hands the
residual stream (``tokens x hidden`` in the model dtype, ~128 MB for a 16k-token step of the 8B)
to stage 1's device, and so on; only the last stage keeps the scored positions. Nothing else
crosses a boundary: q/k/v never leave a layer, positions and prompt boundaries are copied with
the stream. The arithmetic of every layer is the unsplit replica's, so the scores are the same.

The scheduler keeps one step in flight per stage (``in_flight``): while stage 1 computes step
k, stage 0 already computes step k+1 -- on CUDA the launches of a step return before its kernels
ran and the cross-device copies order the stages, so one worker thread keeps every device busy.
One request at idle still crosses every stage in turn: a split adds memory and throughput, not
latency (docs/engines-packed.md says when it is worth it).

Imported only through the packed engine (pulls in torch).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from adapters.runtimes.packed.forward import PackedQwen3Replica

__all__ = ("SplitError", "build_pipeline", "stage_ranges")


class SplitError(ValueError):
    """A split that cannot be built from this configuration (one line, for the config error)."""


def stage_ranges(n_layers: int, n_stages: int, layers: Sequence[int] | None = None) -> list[range]:
    """Each stage's decoder layers: ``layers`` (counts per stage) or as even as possible.

    The even split gives the remainder to the first stages: the last stage's last layer runs its
    MLP on the scored positions only, so the last stage is already the lightest.
    """
    if n_stages < 2:
        raise SplitError(f"split = 'pipeline' needs at least 2 devices, got {n_stages}")
    if n_layers < n_stages:
        raise SplitError(
            f"split = 'pipeline': {n_stages} devices for a model of {n_layers} layers; list at most {n_layers}"
        )
    if layers is None:
        base, extra = divmod(n_layers, n_stages)
        counts = [base + (s < extra) for s in range(n_stages)]
    else:
        counts = list(layers)
        if len(counts) != n_stages:
            raise SplitError(
                f"split_layers has {len(counts)} entries for {n_stages} devices; give one count per device"
            )
        if sum(counts) != n_layers:
            raise SplitError(f"split_layers {counts} sums to {sum(counts)}; the model has {n_layers} layers")
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


class _StageBackbone(torch.nn.Module):
    """The parts of a Qwen3 backbone one stage needs, with the attribute names the replica reads."""

    def __init__(self, backbone: Any, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        # Only the first stage embeds (the table is ~1.2 GB for the 8B: not on every device).
        self.embed_tokens = backbone.embed_tokens if first else None
        self.layers = torch.nn.ModuleList(backbone.layers[i] for i in layers)
        # Each stage moves its own RoPE table and norm to its device (``Module.to`` works in place:
        # a shared module would end up on the last stage's device only).
        self.rotary_emb = backbone.rotary_emb if last else copy.deepcopy(backbone.rotary_emb)
        self.norm = backbone.norm if last else copy.deepcopy(backbone.norm)


def build_pipeline(
    backbone: Any, head: torch.Tensor, devices: Sequence[torch.device], layers: Sequence[int] | None = None, **kw: Any
) -> PackedQwen3Replica:
    """The first stage's replica, its ``next_stage`` chain holding the rest; a runner like any replica."""
    if kw.get("mode", "fused") != "fused":
        raise SplitError("split = 'pipeline' runs the fused mode only")
    ranges = stage_ranges(len(backbone.layers), len(devices), layers)
    stages = [
        PackedQwen3Replica(_StageBackbone(backbone, r, s == 0, s == len(devices) - 1), head, dev, **kw)
        for s, (r, dev) in enumerate(zip(ranges, devices, strict=True))
    ]
    for s, stage in enumerate(stages):
        stage.layer_range = (ranges[s].start, ranges[s].stop)  # the model's numbering, not the stage's
        stage.next_stage = stages[s + 1] if s + 1 < len(stages) else None
    # One step in flight per stage: every device computes a different step at once (on CUDA,
    # where launching returns early; on CPU a step runs whole, stage after stage).
    stages[0].in_flight = len(stages)
    return stages[0]


def describe(first: PackedQwen3Replica) -> list[dict[str, Any]]:
    """Each stage's device and layers, for ``/ready``."""
    return [{"device": str(s.device), "layers": list(s.layer_range)} for s in first.chain()]
