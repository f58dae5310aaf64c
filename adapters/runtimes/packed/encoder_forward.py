"""One cross-encoder replica run packed, without padding: BERT, ELECTRA, RoBERTa and XLM-R heads.

The (query, document) pairs of a step are concatenated into one token sequence (``T`` tokens);
``cu`` holds the cumulative pair lengths. Each pair gets its own positions (from 0, or from
``padding_idx + 1`` for RoBERTa / XLM-R, as their embeddings number non-pad tokens) and its
own token types (1 from the document on, BERT pairs only). Attention is bidirectional *within*
each pair only:

- CUDA: varlen flash attention with ``causal=False`` (``varlen.pick_attention``);
- CPU, or float32 (the varlen kernels take half precision only): one SDPA per pair over exactly
  its tokens, hence equal to the padded model's masked attention within float rounding.

Each layer runs as transformers' module does, with q/k/v as one GEMM (the modules keep views of
the fused weight): post-norm ``LayerNorm(x + dense(attention))``, then
``LayerNorm(h + down(act(up(h))))``. Only each pair's first token goes through the last layer's
output projection and MLP, and the head is the checkpoint's own modules on those rows
(``RobertaClassificationHead``: dense + tanh + out_proj; BERT: pooler dense + tanh, then the
classifier; ELECTRA: dense + gelu + out_proj), so the logits are the model's. The family
(``adapters.families.cross_encoder``) turns them into scores, as for every other runtime.

``PackedPairReplica`` is the part every encoder architecture shares: a step's one host buffer
(ids, positions, one more per-token row, cumulative lengths), its copy to the device, warm-up and
the compiled pointwise regions. ``PackedEncoderReplica`` is the BERT-style arithmetic on it;
``modernbert_forward.PackedModernBertReplica`` is ModernBERT's; ``encoder_replicas.make_replica`` picks by model_type.

Imported only through ``adapters.registry`` (pulls in torch and transformers).
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from adapters.runtimes.packed import varlen
from adapters.runtimes.packed.graphs import CaptureError, StepGraphs, replay_mismatch
from adapters.runtimes.packed.step import HostStaging

__all__ = ("PackedEncoderReplica", "PackedPairReplica", "load_cross_encoder", "position_offset", "real_rows")


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


class _Layer:
    """One encoder layer's tensors, q/k/v fused into one GEMM (weights and biases)."""

    __slots__ = (
        "act",
        "dim",
        "down_b",
        "down_w",
        "heads",
        "ln1",
        "ln2",
        "o_b",
        "o_w",
        "qkv_b",
        "qkv_w",
        "up_b",
        "up_w",
    )

    def __init__(self, layer: Any) -> None:
        a, out = layer.attention.self, layer.attention.output
        lins = (a.query, a.key, a.value)
        self.qkv_w = torch.cat([lin.weight for lin in lins]).contiguous()
        self.qkv_b = torch.cat([lin.bias for lin in lins]).contiguous()
        rows = 0
        for lin in lins:  # the modules keep views: no second copy of the weights in memory
            n = lin.weight.shape[0]
            lin.weight = torch.nn.Parameter(self.qkv_w[rows : rows + n], requires_grad=False)
            lin.bias = torch.nn.Parameter(self.qkv_b[rows : rows + n], requires_grad=False)
            rows += n
        self.heads, self.dim = a.num_attention_heads, a.attention_head_size
        self.o_w, self.o_b = out.dense.weight, out.dense.bias
        self.ln1 = (out.LayerNorm.weight, out.LayerNorm.bias, float(out.LayerNorm.eps))
        self.up_w, self.up_b = layer.intermediate.dense.weight, layer.intermediate.dense.bias
        self.act: Callable[[torch.Tensor], torch.Tensor] = layer.intermediate.intermediate_act_fn
        self.down_w, self.down_b = layer.output.dense.weight, layer.output.dense.bias
        self.ln2 = (layer.output.LayerNorm.weight, layer.output.LayerNorm.bias, float(layer.output.LayerNorm.eps))

    def free_weights(self, layer: Any) -> None:
        """Once quantized (``encoder_fp8``): the four GEMMs' bf16 weights freed, their row counts kept."""
        a = layer.attention.self
        for lin in (
            a.query,
            a.key,
            a.value,
            layer.attention.output.dense,
            layer.intermediate.dense,
            layer.output.dense,
        ):
            lin.weight = torch.nn.Parameter(lin.weight.new_empty(lin.weight.shape[0], 0), requires_grad=False)
        self.qkv_w, self.o_w, self.up_w, self.down_w = (
            t.new_empty(t.shape[0], 0) for t in (self.qkv_w, self.o_w, self.up_w, self.down_w)
        )


def add_ln(
    delta: torch.Tensor, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, real: torch.Tensor
) -> torch.Tensor:
    """``LayerNorm(delta + h)``: the residual add and the post-norm in one pointwise region; rows
    where ``real`` (a (rows, 1) bool) is false -- a CUDA graph's padding -- set to 0 (``real_rows``)."""
    return torch.where(real, F.layer_norm(delta + h, (h.shape[-1],), w, b, eps), 0.0)


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


# The MLP activations the GEMM's epilogue computes: cuBLASLt has bias + GELU (its tanh
# approximation) and bias + ReLU epilogues. "gelu" is the exact (erf) one, approximated there.
EPILOGUE_ACTS = {"gelu": "gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu", "relu": "relu"}


def epilogue_refusal(hidden_act: str) -> str | None:
    """Why the up-projection's activation cannot run in the GEMM's epilogue, or None."""
    if hidden_act not in EPILOGUE_ACTS:
        return f"hidden_act {hidden_act!r} has no GEMM epilogue (only {', '.join(sorted(EPILOGUE_ACTS))})"
    return None


def up_act_fused(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor, act: str) -> torch.Tensor:
    """``act(h @ w.T + b)`` as one GEMM whose epilogue adds the bias and applies the activation.

    Why: the 4x-wide intermediate is then written once, instead of written by the GEMM, read and
    written again by the activation: an XLM-R large step of four d100 requests took 71.5 ms
    instead of 82.3 on the H200 (report gpu-h200-2026-12-02). On CUDA this is cuBLASLt's bias +
    GELU epilogue, which computes GELU's tanh approximation (within 5e-4 of the erf one, below
    bf16's rounding of the activations); elsewhere the same arithmetic in two ops, so the CPU
    tests see the approximation's effect on scores that the GPU has."""
    if act == "relu":
        return torch._addmm_activation(b, h, w.t(), use_gelu=False)
    if h.device.type == "cuda":
        return torch._addmm_activation(b, h, w.t(), use_gelu=True)
    return F.gelu(F.linear(h, w, b), approximate="tanh")


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


class PackedEncoderReplica(PackedPairReplica):
    """BERT, ELECTRA, RoBERTa and XLM-R: post-norm layers, absolute positions, token types."""

    def __init__(
        self,
        model: Any,
        device: torch.device,
        *,
        attention: str,
        compile: bool,
        kernel: str = "auto",
        gelu_epilogue: str = "off",
    ) -> None:
        super().__init__(model, device, compile=compile)
        base = getattr(self.model, self.model.base_model_prefix)
        self._emb = base.embeddings
        self._project = getattr(base, "embeddings_project", None)  # ELECTRA: embedding_size -> hidden_size
        self._layers = [_Layer(layer) for layer in base.encoder.layer]
        # BERT scores pooler(first token) through ``classifier``; the others' ``classifier`` is a
        # head module that takes the (rows, seq, hidden) features and reads position 0 itself.
        pooler = getattr(base, "pooler", None) if self.model_type == "bert" else None
        classifier = self.model.classifier
        if pooler is not None:
            self._head: Callable[[torch.Tensor], torch.Tensor] = lambda h: classifier(pooler(h[:, None, :]))
        else:
            self._head = lambda h: classifier(h[:, None, :])
        dtype = self._layers[0].qkv_w.dtype
        self.attention_name, self._attend = varlen.pick_attention(attention, device, kernel, causal=False, dtype=dtype)
        self._per_sequence = varlen.needs_lengths(self._attend)
        # Every layer's activation is the config's hidden_act (gelu): one module serves them all.
        self._set_regions((add_ln, self._layers[0].act))
        # The up-projection's activation in its GEMM's epilogue (``up_act_fused``): "auto" in half
        # precision on CUDA, where approximating GELU changes less than bf16 already rounds away;
        # "on" everywhere (float32 too); "off" never. None: the activation runs on its own.
        act_name = str(getattr(self.model.config, "hidden_act", ""))
        refusal = epilogue_refusal(act_name)
        if gelu_epilogue == "on" and refusal is not None:
            raise ValueError(f"gelu_epilogue = 'on': {refusal}")
        wanted = gelu_epilogue == "on" or (
            gelu_epilogue == "auto" and device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
        )
        self.epilogue: str | None = EPILOGUE_ACTS[act_name] if wanted and refusal is None else None
        self.fp8: Any = None  # encoder_fp8.EncoderFp8 once ``to_fp8`` ran: the forward's GEMMs in e4m3

    def to_fp8(self, quantize: Callable[[torch.Tensor], Any] | None = None, regions: str = "auto") -> None:
        """Quantize every layer's four GEMMs to e4m3 and run them in FP8 from now on
        (``encoder_fp8``: what stays in the model dtype, how the kernels are picked); the model-dtype
        weights of those GEMMs are freed. The engine loads the model in bfloat16 for it; float32
        (the tests' reference comparison, free of bf16 rounding) runs the same code. ``warm_up``
        again afterwards (the regions compile then)."""
        from adapters.runtimes.packed import encoder_fp8

        self.fp8 = encoder_fp8.EncoderFp8(self, quantize, regions)
        self.epilogue = None  # the activation runs in the quantizing region, not a GEMM's epilogue
        for w, layer in zip(self._layers, getattr(self.model, self.model.base_model_prefix).encoder.layer, strict=True):
            w.free_weights(layer)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def precision(self) -> str:
        return "model dtype" if self.fp8 is None else "fp8 e4m3 GEMMs (per-channel weight, per-token activation scales)"

    def _uncompile(self) -> None:
        super()._uncompile()
        if self.fp8 is not None:  # its compiled regions go too; Triton / vLLM ones picked stay
            self.fp8.pick(False)

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        """The embedding module's own tables and norm, in its order: (word + token type) + position,
        LayerNorm (called piecewise: its forward's signature changed across transformers versions)."""
        e = self._emb
        h = e.LayerNorm(e.word_embeddings(ids) + e.token_type_embeddings(types) + e.position_embeddings(positions))
        return h if self._project is None else self._project(h)

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        types: torch.Tensor,
        cu_long: torch.Tensor,
        max_len: int,
        lens: list[int] | None,
    ) -> torch.Tensor:
        if self.fp8 is not None:  # the same step in FP8 GEMMs: one code path for eager and graphs
            return self.fp8.forward(self, ids, positions, types, cu_long, max_len, lens)
        add_ln_, act = self._regions
        cu = cu_long.to(torch.int32)
        first = cu_long[:-1]
        h = self._embed(ids, positions, types)
        n_tokens = h.shape[0]
        real = real_rows(cu_long, n_tokens)
        last = len(self._layers) - 1
        for i, w in enumerate(self._layers):
            qkv = F.linear(h, w.qkv_w, w.qkv_b).view(n_tokens, 3, w.heads, w.dim)
            q, k, v = qkv.unbind(1)
            o = self._attend(q, k, v, cu, cu, max_len, max_len, lens, lens).reshape(n_tokens, -1)
            if i == last:
                # nothing after this attention mixes positions: keep each pair's first token
                h, o, real = h[first], o[first], real[first]
            h = add_ln_(F.linear(o, w.o_w, w.o_b), h, *w.ln1, real)
            if self.epilogue is not None:
                up = up_act_fused(h, w.up_w, w.up_b, self.epilogue)
            else:
                up = act(F.linear(h, w.up_w, w.up_b))
            h = add_ln_(F.linear(up, w.down_w, w.down_b), h, *w.ln2, real)
        return self._head(h)
