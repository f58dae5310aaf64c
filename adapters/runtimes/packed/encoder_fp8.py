"""FP8 (e4m3) GEMMs for the packed cross-encoders (BERT, ELECTRA, RoBERTa, XLM-R): ``precision = "fp8"``.

The same scheme as Qwen3's (:mod:`.fp8`): each encoder layer's four linear layers -- q/k/v (one
GEMM), attention output, intermediate (up), output (down) -- run as e4m3 GEMMs, weights quantized
once at load with one scale per output channel, activations per token *inside the pointwise
region that produces them*, so the quantization costs no pass of its own over memory:

- "layernorm": ``LayerNorm(delta + bias + h)`` (the post-norm, the GEMM's bias added there), the
  residual stream kept in the model dtype, and its per-token e4m3 copy for the next GEMM (the
  up-projection, or the next layer's q/k/v);
- "act": ``act(up + bias)`` (the model's own GELU / ReLU) then quantized, for the down-projection:
  the bias + activation the bf16 path computes in the up-GEMM's epilogue, with the quantization
  added to the same pass;
- "quant": the attention output and the embeddings' output (FlashAttention and the embedding
  module are opaque to Inductor), quantized on their own.

Each region has a torch reference below; :func:`candidates` lists the kernels this process has
(the references compiled by Inductor, or eager; on CUDA the Triton kernels of
:mod:`.encoder_fp8_triton` in their variants, and vLLM's per-token quantization for "quant") and
:func:`pick` keeps per region the fastest one that computes the reference's result
(``fp8.pick_each``: the rule and tolerance Qwen3's regions are picked by). Each projection's GEMM
is ``fp8_gemm.pick_mm``'s for its own shape (``torch._scaled_mm`` / vLLM CUTLASS on CUDA, the emulation
on CPU); q/k/v's bias is added in its GEMM's epilogue (a separate add of it cost 3 ms of an 18 ms
step on the H100), the other three GEMMs' biases in the regions that follow them. Attention, the
LayerNorms' residual stream, the embeddings and the classifier head stay in the model dtype
(bfloat16). The forward is one function for every device: only the kernels picked differ, so CUDA
graphs capture it as they capture the bf16 one.

Imported only through the packed encoder engine (pulls in torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from adapters.runtimes.packed import fp8, fp8_gemm, kernels
from adapters.runtimes.packed.encoder_forward import add_ln
from adapters.runtimes.packed.pair_replica import real_rows
from adapters.runtimes.packed.picks import on_device

if TYPE_CHECKING:
    from adapters.runtimes.packed.encoder_forward import PackedEncoderReplica

__all__ = ("GEMMS", "REGIONS", "EncoderFp8", "add_ln_q", "candidates", "pick", "reference")

REGIONS = ("layernorm", "act", "quant")
GEMMS = ("qkv", "out", "up", "down")  # each layer's four, in the order of its weights
EncoderRegions = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]


def add_ln_q(
    delta: torch.Tensor,
    bias: torch.Tensor,
    h: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    eps: float,
    real: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``encoder_forward.add_ln(delta + bias, h, ...)`` (padding rows zeroed,
    ``pair_replica.real_rows``) and its per-token e4m3 values and scales. The bias is added to the
    GEMM's model-dtype output first, as ``F.linear``'s output would hold it, then the residual:
    the bf16 path's roundings."""
    x = add_ln(delta + bias, h, w, b, eps, real)
    return (x, *fp8_gemm.quantize_rows(x))


def reference(act: Callable[[torch.Tensor], torch.Tensor]) -> EncoderRegions:
    """The torch functions of the three regions (``act``: the layers' activation module)."""

    def act_q(up: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fp8_gemm.quantize_rows(act(up + bias))

    return add_ln_q, act_q, fp8.quant


# encoder_fp8_triton's variants offered to the picker: (name suffix, reciprocal scale, warps).
TRITON_VARIANTS = (
    ("", False, None),
    (", reciprocal", True, None),
    (", reciprocal, 4 warps", True, 4),
    (", reciprocal, 16 warps", True, 16),
)


def triton_regions(
    hidden_act: str, recip: bool = False, warps: int | None = None
) -> tuple[Callable[..., Any], Callable[..., Any] | None] | None:
    """:mod:`.encoder_fp8_triton`'s (ln_q, act_q) when Triton imports (act_q None: no kernel for ``hidden_act``)."""
    try:
        from adapters.runtimes.packed import encoder_fp8_triton

        return encoder_fp8_triton.build(hidden_act, recip, warps)
    except Exception:  # noqa: BLE001  # no Triton in this install
        return None


def candidates(
    act: Callable[[torch.Tensor], torch.Tensor], compiled: bool, cuda: bool, hidden_act: str = ""
) -> dict[str, dict[str, Any]]:
    """Per region, the kernels this process has, by name (the references first; ``hidden_act``: the
    config's, which names the Triton activation kernel that computes ``act``)."""
    ref = reference(act)
    if compiled:
        family, fns = "compiled (Inductor)", tuple(torch.compile(f, dynamic=True) for f in ref)
    else:
        family, fns = "eager", ref
    out: dict[str, dict[str, Any]] = {r: {family: f} for r, f in zip(REGIONS, fns, strict=True)}
    if cuda:
        # One Triton kernel per region (encoder_fp8_triton; the plain quantization is fp8_triton's).
        # vLLM has no LayerNorm + per-token quant or GELU + quant op (its fused ones are RMSNorm /
        # SiLU): only its plain quantization is a candidate.
        for suffix, recip, warps in TRITON_VARIANTS:
            enc = triton_regions(hidden_act, recip, warps)
            if enc is None:
                break
            out["layernorm"]["triton" + suffix] = enc[0]
            if enc[1] is not None:
                out["act"]["triton" + suffix] = enc[1]
        for suffix, recip in (("", False), (", reciprocal", True)):
            t = fp8.triton_regions(recip)
            if t is not None:
                out["quant"]["triton" + suffix] = t[3]
        v = fp8.vllm_regions()
        if "quant" in v:
            out["quant"]["vLLM dynamic_per_token_scaled_fp8_quant"] = v["quant"]
    return out


def region_inputs(tokens: int, layer: Any, device: torch.device, seed: int = 0) -> dict[str, Any]:
    """Random activations of a step's shapes, and random norm weights and biases of layer ``layer``'s
    shapes and dtype (a checkpoint's may be ones and zeros, which would hide a kernel that drops a
    bias); the last rows are a CUDA graph's padding (``real`` false), which "layernorm" must zero."""
    dtype = layer.o_b.dtype
    g = torch.Generator(device=device).manual_seed(seed)
    hidden, inter = layer.o_b.shape[0], layer.up_b.shape[0]

    def rnd(*shape: int, scale: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=g) * scale + mean).to(dtype)

    real = torch.arange(tokens, device=device)[:, None] < tokens - max(1, tokens // 16)
    return {
        "h": rnd(tokens, hidden, scale=4.0),
        "delta": rnd(tokens, hidden),
        "up": rnd(tokens, inter, scale=2.0),
        "x": rnd(tokens, hidden),
        "real": real,
        "ln": (rnd(hidden, scale=0.2, mean=1.0), rnd(hidden, scale=0.2), layer.ln1[2]),
        "o_b": rnd(hidden),
        "up_b": rnd(inter),
    }


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _deq(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return q.double() * s.double()


def region_error(
    region: str, fn: Any, ref: EncoderRegions, i: dict[str, Any], act: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, float]:
    """``fn`` against the reference, as :func:`fp8.region_error` judges Qwen3's: ``rel_err``, the
    relative difference of the dequantized outputs; ``excess``, how much farther from the exact
    values (float64, not quantized) ``fn``'s are than the reference's (inf when the residual
    stream differs beyond ``fp8.RESIDUAL_TOL``). ``act``: the layers' activation, run in float64."""
    residual = 0.0
    if region == "layernorm":
        delta, bias, h, w, b, eps, real = (i["delta"], i["o_b"], i["h"], *i["ln"], i["real"])
        got_h, *got = fn(delta, bias, h, w, b, eps, real)
        want_h, *want = ref[0](delta, bias, h, w, b, eps, real)
        exact = add_ln(delta.double() + bias.double(), h.double(), w.double(), b.double(), eps, real)
        residual = _rel(got_h, want_h)
    elif region == "act":
        got, want = fn(i["up"], i["up_b"]), ref[1](i["up"], i["up_b"])
        exact = act(i["up"].double() + i["up_b"].double())
    else:
        got, want, exact = fn(i["x"]), ref[2](i["x"]), i["x"].double()
    g, r = _deq(*got), _deq(*want)
    excess = _rel(g, exact) / max(_rel(r, exact), 1e-30) - 1
    if not residual <= fp8.RESIDUAL_TOL:
        excess = float("inf")
    return {"rel_err": _rel(g, r), "excess": excess}


def _call(region: str, fn: Any, i: dict[str, Any]) -> Callable[[], Any]:
    if region == "layernorm":
        return lambda: fn(i["delta"], i["o_b"], i["h"], *i["ln"], i["real"])
    if region == "act":
        return lambda: fn(i["up"], i["up_b"])
    return lambda: fn(i["x"])


@torch.inference_mode()
def pick(
    cands: dict[str, dict[str, Any]],
    ref: EncoderRegions,
    layer: Any,
    device: torch.device,
    choice: str = "auto",
) -> tuple[EncoderRegions, dict[str, Any]]:
    """Each region's kernel among ``cands``: the fastest on a 16k-token step's shapes (CUDA; on CPU
    the first) as correct as ``ref`` (``fp8.REGION_EXCESS``); per region the kernel picked and each candidate's
    error / ms. Checked on 2k tokens (float64 copies of 16k rows would take GBs), timed on all."""
    cuda = device.type == "cuda"
    inputs = region_inputs(16384 if cuda else 64, layer, device)
    check = {k: v[:2048] if k in ("h", "delta", "up", "x", "real") else v for k, v in inputs.items()}
    with on_device(device):
        picked, info = fp8.pick_each(
            cands,
            lambda r, fn: region_error(r, fn, ref, check, layer.act),
            lambda r, fn: _call(r, fn, inputs),
            kernels.median_ms if cuda else None,
            choice,
        )
    return (picked["layernorm"], picked["act"], picked["quant"]), info


class EncoderFp8:
    """A replica's FP8 state: each layer's four quantized weights, the GEMM and the regions picked.

    Made by ``PackedEncoderReplica.to_fp8``; ``forward`` is then the replica's ``_forward``."""

    def __init__(
        self,
        replica: PackedEncoderReplica,
        quantize: Callable[[torch.Tensor], fp8_gemm.Fp8Weight] | None = None,
        choice: str = "auto",
    ) -> None:
        quantize = quantize or fp8_gemm.quantize_weight  # looked up now: a test may replace it
        layers = replica._layers
        self.weights = [tuple(quantize(t) for t in (w.qkv_w, w.o_w, w.up_w, w.down_w)) for w in layers]
        self.device = replica.device
        # One GEMM kernel per projection, timed on its own shape: on the H100 vLLM's CUTLASS and
        # torch's cuBLASLt kernel each won some shapes (the attention output's and the FFN's differ
        # 4x in width). q/k/v's bias has no pointwise region to ride in (attention follows): its
        # GEMM adds it in the epilogue, picked against adding it apart.
        self.mm_kernels: dict[str, str] = {}
        self.mm_timing: dict[str, dict[str, Any]] = {}
        mms = []
        with torch.inference_mode():
            for i, name in enumerate(GEMMS):
                k, n = self.weights[0][i].qt.shape
                kernel, mm, timing = fp8_gemm.pick_mm(
                    self.device, (16384, k, n), layers[0].o_b.dtype, bias=name == "qkv"
                )
                self.mm_kernels[name], self.mm_timing[name] = kernel, timing
                mms.append(mm)
        self.mms: tuple[fp8_gemm.Mm, fp8_gemm.Mm, fp8_gemm.Mm, fp8_gemm.Mm] = (mms[0], mms[1], mms[2], mms[3])
        self._layer0 = layers[0]  # its norms and biases: the regions' check inputs
        self.act = layers[0].act  # every layer's activation is the config's hidden_act
        self.hidden_act = str(getattr(replica.model.config, "hidden_act", ""))
        self.ref = reference(self.act)
        self.choice = choice
        self._cands: tuple[bool, dict[str, dict[str, Any]]] | None = None
        self.regions: EncoderRegions = self.ref
        self.kernels: dict[str, Any] = {}
        self.pick(replica.compiled)

    def pick(self, compiled: bool) -> None:
        """(Re)pick the regions' kernels; compiled candidates are made once per ``compiled`` value."""
        if self._cands is None or self._cands[0] != compiled:
            self._cands = (compiled, candidates(self.act, compiled, self.device.type == "cuda", self.hidden_act))
        self.regions, self.kernels = pick(self._cands[1], self.ref, self._layer0, self.device, self.choice)

    def describe(self) -> dict[str, Any]:
        return {
            "gemm": ", ".join(f"{g}: {k}" for g, k in self.mm_kernels.items()),
            "gemm_timing": self.mm_timing,
            "gemms": self.mm_kernels,
            "quantizing_regions": self.kernels,
        }

    def forward(
        self,
        rep: PackedEncoderReplica,
        ids: torch.Tensor,
        positions: torch.Tensor,
        types: torch.Tensor,
        cu_long: torch.Tensor,
        max_len: int,
        lens: list[int] | None,
    ) -> torch.Tensor:
        """``PackedEncoderReplica._forward`` with the four GEMMs of each layer in FP8."""
        ln_q, act_q, quant = self.regions
        add_ln_ = rep._regions[0]
        mm_qkv, mm_o, mm_up, mm_down = self.mms
        cu = cu_long.to(torch.int32)
        first = cu_long[:-1]
        h = rep._embed(ids, positions, types)
        n_tokens, dt = h.shape[0], h.dtype
        real = real_rows(cu_long, n_tokens)
        last = len(rep._layers) - 1
        x, xs = quant(h)
        for i, (w, (f_qkv, f_o, f_up, f_down)) in enumerate(zip(rep._layers, self.weights, strict=True)):
            qkv = mm_qkv(x, xs, f_qkv, dt, w.qkv_b).view(n_tokens, 3, w.heads, w.dim)
            q, k, v = qkv.unbind(1)
            o = rep._attend(q, k, v, cu, cu, max_len, max_len, lens, lens).reshape(n_tokens, -1)
            if i == last:  # nothing after this attention mixes positions: keep each pair's first token
                h, o, real = h[first], o[first], real[first]
            h, x, xs = ln_q(mm_o(*quant(o), f_o, dt), w.o_b, h, *w.ln1, real)
            delta = mm_down(*act_q(mm_up(x, xs, f_up, dt), w.up_b), f_down, dt)
            if i < last:
                h, x, xs = ln_q(delta, w.down_b, h, *w.ln2, real)
            else:  # the last norm feeds the head (model dtype), not a GEMM: no quantization
                h = add_ln_(delta + w.down_b, h, *w.ln2, real)
        return rep._head(h)
