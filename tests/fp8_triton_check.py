"""The FP8 Triton kernels on CPU under Triton's interpreter, against the torch reference regions.

``--compile-sm90`` (without the interpreter) compiles each kernel for the H200 instead.

Run as ``TRITON_INTERPRET=1 python -m tests.fp8_triton_check`` (the variable must be set before
Triton is imported, hence a process of its own: tests/test_packed_fp8.py starts it). Prints one
JSON line: per region, how many e4m3 values differ from the reference and the largest scale
and residual differences.

Triton's interpreter (3.9) converts fp32 -> bf16 by truncation and fp32 -> e4m3 without carrying
a rounded-up mantissa into the exponent (124.3 becomes 64); the GPU's conversions round to
nearest even. ``_gpu_conversions`` makes the interpreter convert as the GPU does (through torch's
own conversions), so what is checked is the kernels' arithmetic, not the interpreter's.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch


def _gpu_conversions() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    torch_of = {
        tl.float32: torch.float32,
        tl.bfloat16: torch.bfloat16,
        tl.float8e4nv: torch.float8_e4m3fn,
        tl.float8e5: torch.float8_e5m2,
        tl.float16: torch.float16,
    }
    raw = {
        torch.float32: torch.int32,
        torch.bfloat16: torch.int16,
        torch.float16: torch.int16,
        torch.float8_e4m3fn: torch.uint8,
        torch.float8_e5m2: torch.uint8,
    }
    original = interpreter._convert_float

    def convert(data: np.ndarray, src: object, dst: object, rounding_mode: object) -> np.ndarray:
        if src not in torch_of or dst not in torch_of:
            return original(data, src, dst, rounding_mode)
        a, b = torch_of[src], torch_of[dst]
        t = torch.from_numpy(np.ascontiguousarray(data).copy()).view(raw[a]).view(a)
        out = t.to(b).view(raw[b]).numpy()
        return out.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[out.itemsize])

    interpreter._convert_float = convert


def main() -> dict[str, dict[str, float]]:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    _gpu_conversions()
    from adapters.runtimes.packed import fp8, fp8_triton

    torch.manual_seed(0)
    rows = 19
    # widths that are not powers of two (masked blocks) and rows of very different magnitudes
    h = (torch.randn(rows, 96) * torch.logspace(-2, 2, rows)[:, None]).to(torch.bfloat16)
    delta = torch.randn(rows, 96, dtype=torch.bfloat16)
    w = (torch.rand(96) + 0.5).to(torch.bfloat16)
    gate_up = (torch.randn(rows, 2 * 80) * 3).to(torch.bfloat16)
    o = torch.randn(rows, 128, dtype=torch.bfloat16)
    o[3] = 0  # an all-zero row: scale 1e-12 / 448, no inf or nan

    def diff(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> dict[str, float]:
        (gq, gs), (wq, ws) = got[-2:], want[-2:]
        out = {
            "values_differing": int((gq.view(torch.uint8) != wq.view(torch.uint8)).sum()),
            "values": wq.numel(),
            "scale_max_rel": float(((gs - ws).abs() / ws).max()),
            "nonfinite": int((~torch.isfinite(gq.float())).sum()),
        }
        if len(got) == 3:
            out["residual_max_abs"] = float((got[0].float() - want[0].float()).abs().max())
        return out

    eps = 1e-6
    out = {}
    for tag, recip in (("", False), (":recip", True)):  # the division per value, and the reciprocal variant
        rms_q, add_rms_q, silu_mul_q, quant = fp8_triton.build(recip)
        out |= {
            f"rms_q{tag}": diff(rms_q(h, w, eps), fp8.rms_q(h, w, eps)),
            f"add_rms_q{tag}": diff(add_rms_q(h, delta, w, eps), fp8.add_rms_q(h, delta, w, eps)),
            f"silu_mul_q{tag}": diff(silu_mul_q(gate_up), fp8.silu_mul_q(gate_up)),
            f"quant{tag}": diff(quant(o), fp8.quant(o)),
            f"quant_strided{tag}": diff(quant(gate_up[:, :80]), fp8.quant(gate_up[:, :80])),
        }
    return out


def compile_sm90() -> dict[str, dict[str, int]]:
    """Each kernel compiled to PTX and cubin for sm_90 (H100/H200) with the wheel's own ptxas: no GPU needed.

    Counts what the PTX must hold: e4m3 conversions (cvt ... e4m3x2) and IEEE divisions, no approximate one.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from adapters.runtimes.packed import fp8_triton as ft

    rows = {"stride_x": "i32", "stride_q": "i32", "N": "i32", "BLOCK": "constexpr", "RECIP": "constexpr"}
    norm = {
        "X": "*bf16",
        "R": "*bf16",
        "W": "*bf16",
        "H": "*bf16",
        "Q": "*fp8e4nv",
        "S": "*fp32",
        "stride_x": "i32",
        "stride_r": "i32",
        "stride_h": "i32",
        "stride_q": "i32",
        "N": "i32",
        "eps": "fp32",
        "HAS_RES": "constexpr",
        "BLOCK": "constexpr",
        "RECIP": "constexpr",
    }
    io = {"X": "*bf16", "Q": "*fp8e4nv", "S": "*fp32", **rows}
    cases = {}
    for tag, r in (("", 0), (":recip", 1)):  # the division per value, and the reciprocal variant
        cases |= {
            f"add_rms_q{tag}": (ft._norm_q, norm, {"HAS_RES": True, "BLOCK": 1024, "RECIP": r}, 2),
            f"rms_q{tag}": (ft._norm_q, norm, {"HAS_RES": False, "BLOCK": 1024, "RECIP": r}, 2),
            f"silu_mul_q{tag}": (ft._silu_mul_q, io, {"BLOCK": 4096, "RECIP": r}, 8),
            f"quant{tag}": (ft._quant, io, {"BLOCK": 2048, "RECIP": r}, 4),
        }
    out = {}
    for name, (fn, sig, consts, warps) in cases.items():
        k = triton.compile(
            ASTSource(fn=triton.jit(fn), signature=sig, constexprs=consts),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": warps},
        )
        ptx = k.asm["ptx"]
        out[name] = {
            "cubin_bytes": len(k.asm["cubin"]),
            "cvt_e4m3": ptx.count("e4m3x2"),
            "div_rn": ptx.count("div.rn.f32"),
            "div_approx": ptx.count("div.full.f32") + ptx.count("div.approx.f32"),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(compile_sm90() if sys.argv[1:] == ["--compile-sm90"] else main()))
    sys.stdout.flush()
