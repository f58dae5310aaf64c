"""Triton kernels for the FP8 path: each quantizing region of :mod:`.fp8` as one pass over a row.

One program per token (row): the row is loaded once, the region's arithmetic runs in registers
in the same order and with the same bf16 roundings as the torch reference (``fp8.rms_q`` etc.),
then the row's amax gives its scale and the e4m3 values and the scale are stored -- no second
pass over memory for the quantization, which is what cost the first FP8 version its GEMM gain
(Inductor split the row amax and the division into separate loops or kernels).

Imported lazily by :func:`.fp8.triton_regions` (Triton is a CUDA-image dependency, absent on
some CPU installs). Every kernel runs on CPU under Triton's interpreter (``TRITON_INTERPRET=1``),
which is how the tests check their arithmetic without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ("build", "quantize_row")

_E4M3 = torch.float8_e4m3fn


@triton.jit
def quantize_row(y, RECIP: tl.constexpr):
    """A row's per-token e4m3 quantization in registers, how every kernel here (and the
    cross-encoders', :mod:`.encoder_fp8_triton`) ends: the values clamped to e4m3's range, and
    the row's scale ``amax / 448``. ``RECIP``: a product by ``448 / amax`` per value instead of a
    correctly rounded division (:func:`build`)."""
    amax = tl.maximum(tl.max(tl.abs(y), axis=0), 1e-12)
    scale = tl.math.div_rn(amax, 448.0)
    if RECIP:
        q = y * tl.math.div_rn(448.0, amax)
    else:
        q = tl.math.div_rn(y, scale)
    return tl.minimum(tl.maximum(q, -448.0), 448.0), scale


def _norm_q(
    X,
    R,
    W,
    H,
    Q,
    S,
    stride_x,
    stride_r,
    stride_h,
    stride_q,
    N,
    eps,  # Triton's pointer style
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    RECIP: tl.constexpr,
):
    """[h = x + r (stored, model dtype);] y = w * rms(h) in the model dtype; q, s = per-row e4m3 of y."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:  # the residual add rounds to the model dtype, as torch's h + delta does
        x = (x.to(tl.float32) + tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(H + row * stride_h + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = tl.math.rsqrt(tl.math.div_rn(tl.sum(xf * xf, axis=0), N.to(tl.float32)) + eps)  # IEEE /, as torch.mean
    y = (xf * inv).to(x.dtype)  # Qwen3RMSNorm: normalized in fp32, rounded, then times the weight
    w = tl.load(W + cols, mask=mask, other=0.0)
    y = (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype).to(tl.float32)
    q, scale = quantize_row(y, RECIP)
    tl.store(Q + row * stride_q + cols, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row, scale)


def _silu_mul_q(X, Q, S, stride_x, stride_q, N, BLOCK: tl.constexpr, RECIP: tl.constexpr):
    """y = silu(gate) * up of a [gate | up] row, each op rounded to the model dtype; q, s = per-row e4m3 of y."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    u = tl.load(X + row * stride_x + N + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    if RECIP:  # the fast (approximate) division: rounded to bf16 next, as the correctly rounded one is
        silu = tl.fdiv(gf, 1.0 + tl.exp(-gf)).to(g.dtype)
    else:
        silu = tl.math.div_rn(gf, 1.0 + tl.exp(-gf)).to(g.dtype)
    y = (silu.to(tl.float32) * u.to(tl.float32)).to(g.dtype).to(tl.float32)
    q, scale = quantize_row(y, RECIP)
    tl.store(Q + row * stride_q + cols, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row, scale)


def _quant(X, Q, S, stride_x, stride_q, N, BLOCK: tl.constexpr, RECIP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    y = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    q, scale = quantize_row(y, RECIP)
    tl.store(Q + row * stride_q + cols, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row, scale)


def _cfg(n: int, recip: bool) -> dict[str, int]:
    """The whole row in one block; enough warps that a thread holds <= ~16 values (hidden 1,024 .. MLP 12,288)."""
    block = triton.next_power_of_2(n)
    return {"BLOCK": block, "num_warps": max(1, min(16, block // 512)), "RECIP": int(recip)}


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def build(recip: bool = False) -> tuple[Callable[..., Any], ...]:
    """(rms_q, add_rms_q, silu_mul_q, quant) with the signatures of :mod:`.fp8`'s torch regions.

    Under ``TRITON_INTERPRET=1`` (set before Triton is imported) they run on CPU tensors.
    ``recip``: each value multiplied by ``448 / amax`` rather than divided by the scale (and silu's
    division the fast one): a correctly rounded division per value makes these kernels
    instruction-bound on Hopper (the cross-encoders' GELU kernel measured 125 us for 14.9k x 4096
    on the H100, twice its memory time). A value on an e4m3 rounding boundary may round the other
    way; the picker (``fp8.pick_regions``) times both and keeps either only within its error rule.
    """
    norm_k, silu_k, quant_k = triton.jit(_norm_q), triton.jit(_silu_mul_q), triton.jit(_quant)

    def _out(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.empty(x.shape[0], n, dtype=_E4M3, device=x.device),
            torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device),
        )

    def rms_q(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        x = _rows(x)
        n = x.shape[1]
        q, s = _out(x, n)
        norm_k[(x.shape[0],)](x, x, w, x, q, s, x.stride(0), 0, 0, q.stride(0), n, eps, HAS_RES=False, **_cfg(n, recip))
        return q, s

    def add_rms_q(
        h: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, delta = _rows(h), _rows(delta)
        n = h.shape[1]
        q, s = _out(h, n)
        out = torch.empty_like(h)
        norm_k[(h.shape[0],)](
            h,
            delta,
            w,
            out,
            q,
            s,
            h.stride(0),
            delta.stride(0),
            out.stride(0),
            q.stride(0),
            n,
            eps,
            HAS_RES=True,
            **_cfg(n, recip),
        )
        return out, q, s

    def silu_mul_q(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate_up = _rows(gate_up)
        n = gate_up.shape[1] // 2
        q, s = _out(gate_up, n)
        silu_k[(gate_up.shape[0],)](gate_up, q, s, gate_up.stride(0), q.stride(0), n, **_cfg(n, recip))
        return q, s

    def quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = _rows(x)
        n = x.shape[1]
        q, s = _out(x, n)
        quant_k[(x.shape[0],)](x, q, s, x.stride(0), q.stride(0), n, **_cfg(n, recip))
        return q, s

    return rms_q, add_rms_q, silu_mul_q, quant
