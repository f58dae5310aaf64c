"""The cross-encoders' FP8 Triton kernels (adapters/runtimes/packed/encoder_fp8_triton.py) on CPU
under Triton's interpreter, against the torch reference regions of ``encoder_fp8``.

Run as ``TRITON_INTERPRET=1 python -m tests.encoder_fp8_triton_check`` (a process of its own:
the variable must precede Triton's import; tests/test_packed_encoder_fp8.py starts it). The GPU's
fp32 -> bf16 / e4m3 conversions are made the interpreter's as in ``tests.fp8_triton_check``.
Prints one JSON line: per kernel, its relative error (``encoder_fp8.region_error``: what the
picker judges) and how many e4m3 values differ from the reference's.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.nn.functional as F


def main() -> dict[str, dict[str, Any]]:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    from tests.fp8_triton_check import _gpu_conversions

    _gpu_conversions()
    from adapters.runtimes.packed import encoder_fp8, encoder_fp8_triton

    class Layer:  # the shapes region_inputs reads: hidden 96, intermediate 200 (masked blocks)
        o_b = torch.zeros(96, dtype=torch.bfloat16)
        up_b = torch.zeros(200, dtype=torch.bfloat16)
        ln1 = (o_b, o_b, 1e-5)

    inputs = encoder_fp8.region_inputs(37, Layer(), torch.device("cpu"))
    inputs["x"][3] = 0  # an all-zero row: no inf or nan
    acts = {
        "gelu": lambda x: F.gelu(x),
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "relu": F.relu,
    }
    out: dict[str, dict[str, Any]] = {}
    for name, act in acts.items():
        ref = encoder_fp8.reference(act)
        kernels = {}
        for recip, tag in ((False, ""), (True, ":recip")):
            ln_q, act_q = encoder_fp8_triton.build(name, recip=recip)
            kernels[f"act{tag}"] = act_q
            if name == "gelu":
                kernels[f"layernorm{tag}"] = ln_q
        for key, fn in kernels.items():
            region, _, tag = key.partition(":")
            tag = f":{tag}" if tag else ""
            got = encoder_fp8._call(region, fn, inputs)()
            want = encoder_fp8._call(region, ref[REGION_INDEX[region]], inputs)()
            gq, wq = got[-2], want[-2]
            out[f"{region}:{name}{tag}"] = {
                **encoder_fp8.region_error(region, fn, ref, inputs, act),
                "values_differing": int((gq.view(torch.uint8) != wq.view(torch.uint8)).sum()),
                "values": wq.numel(),
                "nonfinite": int((~torch.isfinite(gq.float())).sum()),
            }
            if region == "layernorm":
                out[f"{region}:{name}{tag}"]["padding_zero"] = bool(got[0][~inputs["real"][:, 0]].eq(0).all())
    return out


REGION_INDEX = {"layernorm": 0, "act": 1}


def compile_sm90() -> dict[str, dict[str, int]]:
    """Each kernel compiled to PTX and cubin for sm_90 (H100/H200) with the wheel's ptxas, no GPU:
    the interpreter runs what the GPU compiler might refuse (a bool pointer, erf)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from adapters.runtimes.packed import encoder_fp8_triton as et

    ln = {
        **{k: "*bf16" for k in ("D", "B", "X", "W", "LB")},
        "REAL": "*i1",
        "H": "*bf16",
        "Q": "*fp8e4nv",
        "S": "*fp32",
        **{k: "i32" for k in ("stride_d", "stride_x", "stride_h", "stride_q", "N")},
        "eps": "fp32",
        "BLOCK": "constexpr",
        "RECIP": "constexpr",
    }
    act = {"U": "*bf16", "B": "*bf16", "Q": "*fp8e4nv", "S": "*fp32", "stride_u": "i32", "stride_q": "i32", "N": "i32"}
    cases = {}
    for recip in (0, 1):  # the division per value, and the reciprocal variant
        tag = ":recip" if recip else ""
        cases[f"ln_q{tag}"] = (et._ln_q, ln, {"BLOCK": 1024, "RECIP": recip})
        for name, code in (("gelu", 0), ("gelu_tanh", 1), ("relu", 2)):
            cases[f"act_q:{name}{tag}"] = (
                et._act_q,
                {**act, "ACT": "constexpr", "BLOCK": "constexpr", "RECIP": "constexpr"},
                {"ACT": code, "BLOCK": 4096, "RECIP": recip},
            )
    out = {}
    for name, (fn, sig, consts) in cases.items():
        k = triton.compile(
            ASTSource(fn=triton.jit(fn), signature=sig, constexprs=consts),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4},
        )
        ptx = k.asm["ptx"]
        out[name] = {"cubin_bytes": len(k.asm["cubin"]), "cvt_e4m3": ptx.count("e4m3x2")}
    return out


if __name__ == "__main__":
    import sys

    print(json.dumps(compile_sm90() if sys.argv[1:] == ["--compile-sm90"] else main()))
