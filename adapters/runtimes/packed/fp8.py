"""FP8 (e4m3) GEMMs for the packed forward: per-channel weight scales, per-token activation scales.

Weights are quantized once at load from the bf16 checkpoint, one scale per output channel
(``amax / 448``); activations per token (row), inside the pointwise region that produces them
(RMSNorm, silu·mul) so the quantization costs no extra pass over memory: on the H200 separate
quantization kernels cost 9.8 ms of a d100 step's 15.2 ms of FP8 GEMMs (issue 24). The GEMM
computes ``(xq @ wq.T) * sx * sw`` in fp32 and writes bf16: ``torch._scaled_mm`` (rowwise
scales, fast accumulation) or vLLM's CUTLASS kernel, whichever times faster at start; on CPU an
emulation of the same arithmetic (fp8 values, fp32 products). Attention, norms, RoPE, the
residual stream and the LM-head rows stay in the model's dtype.

Imported only through ``adapters.registry`` (pulls in torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from adapters.runtimes.packed import kernels

__all__ = (
    "E4M3_MAX",
    "Fp8Weight",
    "add_rms_q",
    "mm_emulated",
    "mm_torch",
    "mm_vllm",
    "quant",
    "quantize_rows",
    "quantize_weight",
    "rms_q",
    "silu_mul_q",
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

Mm = Callable[[torch.Tensor, torch.Tensor, Fp8Weight, torch.dtype], torch.Tensor]


def mm_emulated(xq: torch.Tensor, xs: torch.Tensor, w: Fp8Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """The FP8 GEMM's arithmetic on any device: fp8 values, fp32 products and sums, scales after."""
    return ((xq.to(torch.float32) @ w.qt.to(torch.float32)) * xs * w.scale).to(out_dtype)


def mm_torch(xq: torch.Tensor, xs: torch.Tensor, w: Fp8Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """``torch._scaled_mm`` with rowwise scales (CUDA, sm_89+), fast accumulation as measured in the issue."""
    return torch._scaled_mm(xq, w.qt, scale_a=xs, scale_b=w.scale, out_dtype=out_dtype, use_fast_accum=True)


def mm_vllm() -> Mm | None:
    """vLLM's CUTLASS FP8 GEMM with per-token and per-channel scales, when vLLM's CUDA ops load."""
    try:
        from vllm import _custom_ops as ops

        fn = ops.cutlass_scaled_mm
    except Exception:  # noqa: BLE001  # no vLLM, or not its CUDA build
        return None

    def mm(xq: torch.Tensor, xs: torch.Tensor, w: Fp8Weight, out_dtype: torch.dtype) -> torch.Tensor:
        return fn(xq, w.qt, xs, w.scale, out_dtype)

    return mm


def pick_mm(device: torch.device, shape: tuple[int, int, int], dtype: torch.dtype) -> tuple[str, Mm, dict[str, Any]]:
    """The GEMM for ``device``: on CUDA the faster of torch's and vLLM's (timed on ``shape`` = (M, K, N))
    among those that compute the emulation's result; elsewhere the emulation."""
    if device.type != "cuda":
        return "emulated (fp8 values, fp32 GEMM)", mm_emulated, {}
    m, k, n = shape
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=dtype, generator=g)
    w = quantize_weight(torch.randn(n, k, device=device, dtype=dtype, generator=g) / k**0.5)
    xq, xs = quantize_rows(x)
    want = mm_emulated(xq[:256], xs[:256], w, torch.float32)
    info: dict[str, Any] = {}
    best: tuple[str, Mm] | None = None
    for name, fn in (("torch._scaled_mm", mm_torch), ("vLLM cutlass_scaled_mm", mm_vllm())):
        if fn is None:
            continue
        try:
            got = fn(xq[:256], xs[:256], w, dtype).float()
            err = ((got - want).norm() / want.norm()).item()
            if err > 1e-2:  # bf16 output of the same products: ~4e-3
                info[name] = {"rel_err": err}
                continue
            info[name] = {"ms": kernels.median_ms(lambda fn=fn: fn(xq, xs, w, dtype)), "rel_err": err}
        except Exception as exc:  # noqa: BLE001  # a kernel this GPU or build lacks
            info[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        if best is None or info[name]["ms"] < info[best[0]]["ms"]:
            best = (name, fn)
    if best is None:
        raise RuntimeError(f"precision = 'fp8': no FP8 GEMM works on {device} ({info})")
    return best[0], best[1], info


# -- pointwise regions that end in a quantization (compiled one by one, like kernels.rms etc.) ----
# Each rounds to the model dtype first, as the bf16 path would hand the GEMM its input.

def rms_q(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows(kernels.rms(x, w, eps))


def add_rms_q(h: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h, x = kernels.add_rms(h, delta, w, eps)
    return (h, *quantize_rows(x))


def silu_mul_q(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows(kernels.silu_mul(gate_up))


def quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention output: FA3 is opaque to Inductor, so this one is its own (small) kernel."""
    return quantize_rows(x)
