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

The step every encoder architecture shares -- its one host buffer (ids, positions, one more
per-token row, cumulative lengths), its copy to the device, CUDA graphs, warm-up and the
compiled pointwise regions -- is ``pair_replica.PackedPairReplica``; ``PackedEncoderReplica``
here is the BERT-style arithmetic on it; ``modernbert_forward.PackedModernBertReplica`` is
ModernBERT's; ``encoder_replicas.make_replica`` picks by model_type.

Imported only through ``adapters.registry`` (pulls in torch and transformers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from adapters.runtimes.packed import varlen
from adapters.runtimes.packed.pair_replica import PackedPairReplica, real_rows

__all__ = ("PackedEncoderReplica",)


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
