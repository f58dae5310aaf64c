"""FP8 (e4m3) weights and GEMMs for the packed forwards: per-channel weight scales, per-token activation scales.

Weights are quantized once at load from the bf16 checkpoint, one scale per output channel
(``amax / 448``); activations per token (row), by the quantizing regions of :mod:`.fp8` (Qwen3)
and :mod:`.encoder_fp8` (cross-encoders). The GEMM computes ``(xq @ wq.T) * sx * sw (+ bias)`` in
fp32 and writes bf16: ``torch._scaled_mm`` (rowwise scales, fast accumulation) or vLLM's CUTLASS
kernel, whichever times faster at start on the caller's shape (:func:`pick_mm`); on CPU an
emulation of the same arithmetic (fp8 values, fp32 products).

Imported only through ``adapters.registry`` (pulls in torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from adapters.runtimes.packed import kernels

__all__ = (
    "E4M3",
    "E4M3_MAX",
    "Fp8Weight",
    "Mm",
    "mm_emulated",
    "mm_torch",
    "mm_vllm",
    "pick_mm",
    "quantize_rows",
    "quantize_weight",
)

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
_TINY = 1e-12  # an all-zero row gets a scale that divides without inf


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row scaled to e4m3's range: (fp8 values, fp32 scales of shape (rows, 1)); x ≈ q * s."""
    xf = x.to(torch.float32)
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_min(_TINY) / E4M3_MAX
    return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


class Fp8Weight:
    """A (out, in) weight as fp8 with one scale per output channel, in the layout the GEMMs take.

    ``qt`` is the (in, out) transpose of a row-major (out, in) tensor, i.e. column-major, as
    ``torch._scaled_mm`` and CUTLASS want their second operand; ``scale`` is (1, out) fp32.
    """

    __slots__ = ("qt", "scale")

    def __init__(self, qt: torch.Tensor, scale: torch.Tensor) -> None:
        self.qt, self.scale = qt, scale

    @property
    def out_features(self) -> int:
        return self.qt.shape[1]

    def dequantized(self) -> torch.Tensor:
        """The (out, in) fp32 weight these fp8 values and scales stand for."""
        return self.qt.t().to(torch.float32) * self.scale.t()


def quantize_weight(w: torch.Tensor) -> Fp8Weight:
    q, s = quantize_rows(w)  # rows of an (out, in) weight are output channels
    return Fp8Weight(q.t(), s.t().contiguous())


# -- GEMMs: (tokens, in) fp8 x per-token scales  @  Fp8Weight  ->  (tokens, out) in `out_dtype` ----

# (xq, xs, w, out_dtype[, bias]) -> out: a bias, when given, is added to the fp32 result before the
# one rounding to ``out_dtype`` (a GEMM epilogue's arithmetic), saving a pass over the output.
Mm = Callable[..., torch.Tensor]


def mm_emulated(
    xq: torch.Tensor, xs: torch.Tensor, w: Fp8Weight, out_dtype: torch.dtype, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The FP8 GEMM's arithmetic on any device: fp8 values, fp32 products and sums, scales after."""
    y = (xq.to(torch.float32) @ w.qt.to(torch.float32)) * xs * w.scale
    return (y if bias is None else y + bias.to(torch.float32)).to(out_dtype)


def mm_torch(
    xq: torch.Tensor, xs: torch.Tensor, w: Fp8Weight, out_dtype: torch.dtype, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``torch._scaled_mm`` with rowwise scales (CUDA, sm_89+), fast accumulation as measured in the issue."""
    return torch._scaled_mm(xq, w.qt, scale_a=xs, scale_b=w.scale, bias=bias, out_dtype=out_dtype, use_fast_accum=True)


def mm_vllm() -> Mm | None:
    """vLLM's CUTLASS FP8 GEMM with per-token and per-channel scales, when vLLM's CUDA ops load."""
    try:
        from vllm import _custom_ops as ops

        fn = ops.cutlass_scaled_mm
    except Exception:  # noqa: BLE001  # no vLLM, or not its CUDA build
        return None

    def mm(
        xq: torch.Tensor, xs: torch.Tensor, w: Fp8Weight, out_dtype: torch.dtype, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return fn(xq, w.qt, xs, w.scale, out_dtype, bias)

    return mm


def _bias_after(fn: Mm) -> Mm:
    """``fn`` without its epilogue bias: the bias added by a separate kernel (a build whose GEMM
    refuses a bias with rowwise scales still serves a model with biases)."""

    def mm(
        xq: torch.Tensor, xs: torch.Tensor, w: Fp8Weight, out_dtype: torch.dtype, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        y = fn(xq, xs, w, out_dtype)
        return y if bias is None else y + bias

    return mm


def pick_mm(
    device: torch.device, shape: tuple[int, int, int], dtype: torch.dtype, bias: bool = False
) -> tuple[str, Mm, dict[str, Any]]:
    """The GEMM for ``device``: on CUDA the faster of torch's and vLLM's (timed on ``shape`` = (M, K, N))
    among those that compute the emulation's result; elsewhere the emulation. ``bias``: picked for
    GEMMs called with a bias, each kernel tried with it in its epilogue and with a separate add
    (on the H100 a separate add of q/k/v's bias cost 3 ms of a 18 ms bge-m3 d100 step)."""
    if device.type != "cuda":
        return "emulated (fp8 values, fp32 GEMM)", mm_emulated, {}
    m, k, n = shape
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=dtype, generator=g)
    w = quantize_weight(torch.randn(n, k, device=device, dtype=dtype, generator=g) / k**0.5)
    b = torch.randn(n, device=device, dtype=dtype, generator=g) if bias else None
    xq, xs = quantize_rows(x)
    want = mm_emulated(xq[:256], xs[:256], w, torch.float32, b)
    info: dict[str, Any] = {}
    best: tuple[str, Mm] | None = None
    kernels_: list[tuple[str, Mm | None]] = [("torch._scaled_mm", mm_torch), ("vLLM cutlass_scaled_mm", mm_vllm())]
    if bias:
        kernels_ += [(f"{name}, bias added after", _bias_after(fn)) for name, fn in kernels_ if fn is not None]
    for name, fn in kernels_:
        if fn is None:
            continue
        try:
            got = fn(xq[:256], xs[:256], w, dtype, b).float()
            err = ((got - want).norm() / want.norm()).item()
            if err > 1e-2:  # bf16 output of the same products: ~4e-3
                info[name] = {"rel_err": err}
                continue
            info[name] = {"ms": kernels.median_ms(lambda fn=fn: fn(xq, xs, w, dtype, b)), "rel_err": err}
        except Exception as exc:  # noqa: BLE001  # a kernel this GPU or build lacks
            info[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        if best is None or info[name]["ms"] < info[best[0]]["ms"]:
            best = (name, fn)
    if best is None:
        raise RuntimeError(f"precision = 'fp8': no FP8 GEMM works on {device} ({info})")
    return best[0], best[1], info
