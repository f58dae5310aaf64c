"""What every packed cross-encoder replica shares, whatever its layers: ``PackedPairReplica``.

A step's (query, document) pairs are concatenated into one token sequence; ``PackedPairReplica``
lays it out in one host buffer (ids, positions, one more per-token row, cumulative lengths),
copies it to the device in one copy, launches the architecture's ``_forward`` on it eagerly or
as a replayed CUDA graph (padded to a bucket: :mod:`.buckets`, :mod:`.graphs`), collects the
logits, and warms up and compiles the pointwise regions the subclass names. Beside it the
checkpoint's loading (``load_cross_encoder``), the first position id (``position_offset``) and
the rows a graph's padding fills (``real_rows``, which every forward zeroes after each layer).

Apart from the layers' arithmetic (``encoder_forward.PackedEncoderReplica``: BERT, ELECTRA,
RoBERTa, XLM-R; ``modernbert_forward.PackedModernBertReplica``) because it is the same for every
architecture: each of those modules builds on this one and none on the other.

Imported only through ``adapters.registry`` (pulls in torch and transformers).
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from adapters.runtimes.packed.graphs import CaptureError, StepGraphs, replay_mismatch
from adapters.runtimes.packed.step import HostStaging

__all__ = ("PackedPairReplica", "load_cross_encoder", "position_offset", "real_rows")


def load_cross_encoder(path: str, revision: str | None, dtype: torch.dtype) -> Any:
    """The checkpoint's ``*ForSequenceClassification`` model on CPU, eval mode, no gradients."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, revision=revision, dtype=dtype)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def position_offset(model_type: str, pad_token_id: int | None) -> int:
    """First position id of a sequence: RoBERTa-style embeddings count from ``padding_idx + 1``."""
    if model_type in ("roberta", "xlm-roberta"):
        return int(pad_token_id if pad_token_id is not None else 1) + 1
    return 0


def real_rows(cu_long: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """(n_tokens, 1) bool: which rows hold a pair's token (the rest is a CUDA graph bucket's padding).

    Why the padding rows are zeroed after every layer: the varlen kernels never write a padding
    row's attention output, so it holds whatever the graphs' shared memory pool last held there,
    and FlashAttention-3 loads keys and values in whole tiles past a sequence's end, masking
    their scores but multiplying their values by those zero weights (0 * NaN = NaN: FA3 issue
    #1745). A NaN left in the padding thus reached the last pair in the next layer, and the one
    before it in the layer after: the non-finite steps under load on the H200 (report
    gpu-h200-2026-12-03: the last 29 pairs of a step, ending at its last real token, on a graph's
    first replay). Zeroed, the padding rows' keys and values are finite and weigh nothing."""
    return (torch.arange(n_tokens, device=cu_long.device) < cu_long[-1])[:, None]


class PackedPairReplica(abc.ABC):
    """The model on one device; ``score`` runs one packed step. Not thread-safe: one worker uses it.

    Subclasses set ``attention_name``, ``_per_sequence`` and ``_eager_regions`` (the pointwise
    functions compiled one by one) and define ``_forward``; ``_per_token`` fills the third
    per-token row of the step's buffer (BERT: token types).
    """

    _eager_regions: tuple[Callable[..., Any], ...] = ()
    attention_name: str
    _per_sequence: bool

    def __init__(self, model: Any, device: torch.device, *, compile: bool) -> None:
        self.device = device
        self.model = model.to(device)
        self.model_type = str(model.config.model_type)
        self._offset = position_offset(self.model_type, model.config.pad_token_id)
        self.pipelined = device.type == "cuda"  # see PackedQwen3Replica: host prep overlaps the device
        self.compiled = compile
        self.compile_error: str | None = None
        self._staging = HostStaging(
            device
        )  # pinned on CUDA; two alternate so step k+1 is filled while step k's copy may run
        self._arange = torch.arange(0)
        self.graphs: StepGraphs | None = None  # set by ``use_graphs``
        self.graph_error: str | None = None

    def _set_regions(self, eager: tuple[Callable[..., Any], ...]) -> None:
        """The pointwise regions, compiled when ``compile``: the GEMMs and attention stay eager
        (cuBLAS, FlashAttention), the pointwise work between them is what compiling fuses, one
        small graph each (as the Qwen3 replica does)."""
        self._eager_regions = eager
        self._regions = eager
        if self.compiled:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            self._regions = tuple(torch.compile(f, dynamic=True) for f in eager)

    def _uncompile(self) -> None:
        self.compiled = False
        self._regions = self._eager_regions

    def warm_up(self, batches: Sequence[tuple[Sequence[Sequence[int]], Sequence[int | None]]]) -> None:
        """Run ``batches`` now so compilation happens before traffic; an uncompilable graph falls back to eager."""
        try:
            for prompts, segments in batches:
                self.score(prompts, segments)
        except Exception as exc:
            if not self.compiled:
                raise
            self.compile_error = f"{type(exc).__name__}: {exc}"[:500]
            self._uncompile()
            for prompts, segments in batches:
                self.score(prompts, segments)

    def score(
        self, prompts: Sequence[Sequence[int]], segments: Sequence[int | None] | None = None
    ) -> list[list[float]]:
        """The head's logits (one row per pair)."""
        return self.collect(self.launch(prompts, segments))

    def _per_token(self, out: np.ndarray, lens: list[int], segments: Sequence[int | None]) -> None:
        """The third per-token row: token types, 1 from each typed pair's document on (BERT pairs)."""
        out[:] = 0
        start = 0
        for k, seg in zip(lens, segments, strict=True):
            if seg is not None:
                out[start + seg : start + k] = 1
            start += k

    def _per_token_padding(self, pairs: int) -> int:
        """The third row's value on padding tokens (``pairs``: the real pairs; index ``pairs`` is the first empty one)."""
        return 0

    def _pack(
        self, prompts: Sequence[Sequence[int]], segments: Sequence[int | None], pad: tuple[int, int] | None = None
    ) -> tuple[torch.Tensor, list[int]]:
        """ids, positions, ``_per_token``'s row and cumulative lengths in one int64 host tensor (one copy to the device).

        ``pad`` = (tokens, pairs) > the step's: a CUDA graph's bucket (``graphs`` says why the
        padding is inert): padding tokens after the last pair, empty pairs after the real ones."""
        lens = [len(p) for p in prompts]
        total, n = sum(lens), len(lens)
        t, m = pad or (total, n)
        if self._arange.numel() < max(lens):
            self._arange = torch.arange(max(max(lens), 4096), dtype=torch.long)
        buf = self._staging.buffer(3 * t + m + 1)
        arr = buf.numpy()
        arr[:total] = np.fromiter(itertools.chain.from_iterable(prompts), dtype=np.int64, count=total)
        arr[total:t] = 0
        ar = self._arange.numpy()
        arr[t : t + total] = np.concatenate([ar[:k] for k in lens]) + self._offset
        arr[t + total : 2 * t] = self._offset
        self._per_token(arr[2 * t : 2 * t + total], lens, segments)
        arr[2 * t + total : 3 * t] = self._per_token_padding(n)
        arr[3 * t] = 0
        np.cumsum(lens, out=arr[3 * t + 1 : 3 * t + 1 + n])
        arr[3 * t + 1 + n : 3 * t + 1 + m] = total
        return buf[: 3 * t + m + 1], lens

    @torch.inference_mode()
    def launch(
        self,
        prompts: Sequence[Sequence[int]],
        segments: Sequence[int | None] | None = None,
        *,
        idle: bool = False,
        eager: bool = False,
    ) -> tuple[torch.Tensor, int, Any]:
        """Prepare the step on the host and queue its kernels (or its graph); on CUDA this returns
        before they ran. The handle: logits (on the device, or pinned host memory for a graph),
        pairs, and for a graph the event after its logits reach the host, which replay it was and
        the pairs' lengths (None: eager). ``idle`` (the
        scheduler's: no request waits behind this step) spares the step a capture where it can
        (``graphs`` says how and why); ``eager``: no graph, the kernels launched one by one."""
        n = len(prompts)
        segments = list(segments) if segments is not None else [None] * n
        graphs = None if eager else self.graphs
        if graphs is not None:
            lens = [len(p) for p in prompts]
            tokens = sum(lens)
            key = graphs.key(tokens, n, max(lens), idle=idle)
            if key is not None:
                host, _ = self._pack(prompts, segments, pad=key[:2])
                try:
                    out, done, replay = graphs.launch(host, key, tokens, self._staging.copy_into, idle=idle)
                    return out, n, (done, replay, lens)
                except CaptureError:
                    pass  # this bucket runs eagerly from now on (graphs.failed says why)
        if self.compiled and n == 1:
            # dynamic=True still specializes a size of 1: a 1-token second pair keeps one graph.
            prompts, segments = [prompts[0], prompts[0][:1]], [segments[0], None]
        host, lens = self._pack(prompts, segments)
        total = sum(lens)
        per_seq = lens if self._per_sequence else None
        if self.device.type != "cuda":
            return (
                self._forward(
                    host[:total],
                    host[total : 2 * total],
                    host[2 * total : 3 * total],
                    host[3 * total :],
                    max(lens),
                    per_seq,
                ),
                n,
                None,
            )
        with torch.cuda.device(self.device):
            d = self._staging.to_device(host)
            return (
                self._forward(
                    d[:total], d[total : 2 * total], d[2 * total : 3 * total], d[3 * total :], max(lens), per_seq
                ),
                n,
                None,
            )

    def collect(self, handle: tuple[torch.Tensor, int, Any]) -> list[list[float]]:
        logits, n, graph = handle
        if graph is None:
            return logits[:n].float().tolist()  # waits for the device
        done, replay, lens = graph  # a graph's logits, copied home behind it
        done.synchronize()
        rows = logits[:n]
        finite = torch.isfinite(rows).all(dim=1)
        if self.graphs is not None and not bool(finite.all()):
            self.graphs.nonfinite(replay, (~finite).nonzero().flatten().tolist(), lens)
        return rows.tolist()

    def use_graphs(self, max_tokens: int, check: tuple[Sequence[Sequence[int]], Sequence[int | None]]) -> None:
        """Replay CUDA graphs (``graphs``) for steps up to ``max_tokens`` tokens, if this replica
        can and one replay of ``check``'s pairs agrees with the eager forward; else stay eager
        and say why in ``graph_error``."""
        if self.device.type != "cuda" or self._per_sequence:
            return
        prompts, segments = check
        want = self.score(prompts, segments)
        try:
            self.graphs = StepGraphs(self._forward, self.device, offset=self._offset, max_tokens=max_tokens)
            got = self.score(prompts, segments)
            again = self.score(prompts, segments)
        except Exception as exc:  # noqa: BLE001  # no graphs here at all (no pool...): eager, as before
            # (a bucket that cannot be captured runs eagerly on its own: CaptureError in ``launch``)
            self.graphs = None
            self.graph_error = f"{type(exc).__name__}: {exc}"[:500]
            return
        self.graph_error = replay_mismatch(want, got, again)
        if self.graph_error is not None:
            self.graphs = None

    @abc.abstractmethod
    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        per_token: torch.Tensor,
        cu_long: torch.Tensor,
        max_len: int,
        lens: list[int] | None,
    ) -> torch.Tensor:
        """The architecture's layers and head on one packed step: one row of logits per pair."""
