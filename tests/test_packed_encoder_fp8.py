"""``precision = "fp8"`` for cross-encoders on engine ``packed`` (adapters/runtimes/packed/encoder_fp8.py), on CPU.

CPU has no FP8 GEMM unit: the engine runs the same arithmetic emulated (fp8 values, fp32
products), with the same forward the CUDA path runs (only the kernels picked differ). Here:

- the FP8 forward against a reference written independently: transformers' own modules on each
  pair alone, each encoder linear layer replaced by "quantize the input per token in fp32, multiply
  by the dequantized weight (``Fp8Weight.dequantized``), add the bias" -- equal within bf16 rounding;
- FP8 scores against the fp32 and bf16 model: within the measured quantization error;
- the region picker never uses a kernel that computes something else, however fast;
- the config takes fp8 for BERT / ELECTRA / XLM-R (not ModernBERT), and the engine starts with
  the ranking gate (random weights fail it: ``precision_gate = "warn"`` serves, "refuse" refuses).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adapters.base import EngineConfigError, ScoreJob
from adapters.registry import build_engine
from adapters.runtimes.packed import encoder_fp8, fp8, fp8_gemm, gate
from adapters.runtimes.packed.encoder_replicas import make_replica
from adapters.runtimes.packed.pair_replica import load_cross_encoder
from schemas.config import PackedEngineConfig
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_cross_encoder, build_tiny_modernbert

KINDS = ("xlmr", "bert", "electra")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread: the reductions' order (and so the roundings) fixed, and faster on 2 busy cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _random_biases(path: Path) -> Path:
    """The checkpoint with random biases and LayerNorm weights (a fresh one has zeros and ones,
    which would hide a bias added twice, to the wrong GEMM or not at all)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(path))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            elif "LayerNorm.weight" in name:
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("packed-encoder-fp8")
    out = {kind: _random_biases(build_tiny_cross_encoder(base / kind, kind=kind)) for kind in KINDS}
    out["modernbert"] = build_tiny_modernbert(base / "modernbert")
    return out


def _pairs(kind: str, n: int = 24, seed: int = 0) -> tuple[list[list[int]], list[int | None]]:
    """Random pairs of token ids (no pad or special ids: positions count every token), lengths 5..60;
    BERT's token types start at a random segment boundary."""
    g = torch.Generator().manual_seed(seed)
    prompts, segments = [], []
    for _ in range(n):
        length = int(torch.randint(5, 60, (1,), generator=g))
        prompts.append(torch.randint(5, 100, (length,), generator=g).tolist())
        segments.append(int(torch.randint(1, length, (1,), generator=g)) if kind == "bert" else None)
    return prompts, segments


def _replica(path: Path, dtype: torch.dtype = torch.bfloat16):
    return make_replica(load_cross_encoder(str(path), None, dtype), CPU, attention="auto", compile=False)


class _Fp8Linear(torch.nn.Module):
    """The reference's linear layer: the input quantized per token in plain fp32 torch (amax / 448,
    e4m3 cast, back), times the dequantized weight in fp32, rounded to the model dtype, plus the bias
    -- or, ``epilogue_bias`` (q/k/v: the engine's GEMM adds that bias before its one rounding), plus
    the bias in fp32, then rounded."""

    def __init__(self, weight: fp8_gemm.Fp8Weight, bias: torch.Tensor, epilogue_bias: bool = False) -> None:
        super().__init__()
        self.w, self.b, self.epilogue_bias = weight.dequantized(), bias, epilogue_bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        s = xf.abs().amax(dim=-1, keepdim=True) / 448.0
        xq = (xf / s).to(torch.float8_e4m3fn).float() * s
        if self.epilogue_bias:
            return (xq @ self.w.T + self.b.float()).to(x.dtype)
        return (xq @ self.w.T).to(x.dtype) + self.b


def _reference_logits(path: Path, weights, kind: str, prompts, segments, dtype: torch.dtype = torch.bfloat16):
    """transformers' modules, each pair alone (no padding), the encoder's linear layers replaced by ``_Fp8Linear``."""
    model = load_cross_encoder(str(path), None, dtype)
    base = getattr(model, model.base_model_prefix)
    for layer, (f_qkv, f_o, f_up, f_down) in zip(base.encoder.layer, weights, strict=True):
        a = layer.attention.self
        n = a.query.weight.shape[0]
        for i, name in enumerate(("query", "key", "value")):
            rows = fp8_gemm.Fp8Weight(f_qkv.qt[:, i * n : (i + 1) * n], f_qkv.scale[:, i * n : (i + 1) * n])
            setattr(a, name, _Fp8Linear(rows, getattr(a, name).bias, epilogue_bias=True))
        out = layer.attention.output
        out.dense = _Fp8Linear(f_o, out.dense.bias)
        layer.intermediate.dense = _Fp8Linear(f_up, layer.intermediate.dense.bias)
        layer.output.dense = _Fp8Linear(f_down, layer.output.dense.bias)
    rows = []
    with torch.inference_mode():
        for ids, seg in zip(prompts, segments, strict=True):
            x = torch.tensor([ids])
            types = torch.zeros_like(x)
            if seg is not None:
                types[0, seg:] = 1
            rows.append(model(input_ids=x, token_type_ids=types).logits[0].float())
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_encoder_equals_the_dequantized_reference(dirs, kind, dtype, one_thread):
    prompts, segments = _pairs(kind)
    rep = _replica(dirs[kind], dtype)  # float32: the same code, free of bf16's roundings
    rep.to_fp8()
    got = torch.tensor(rep.score(prompts, segments))
    want = _reference_logits(dirs[kind], rep.fp8.weights, kind, prompts, segments, dtype)
    diff = (got - want).abs().flatten()
    # Same fp8 values and products, the scales applied in another order (after the GEMM vs
    # dequantized before it): most pairs equal within 1e-5 (measured 96-100 % in fp32, 62-79 % in
    # bf16), the others where an activation sat on an e4m3 rounding boundary and one side rounded
    # it the other way, which later layers carry on: measured <= 0.2 % of the logits' spread in
    # fp32, <= 4.9 % in bf16. A wrong scale, bias or region moves every pair.
    exact, most = (0.9, 0.01) if dtype == torch.float32 else (0.5, 0.08)
    assert (diff <= 1e-5).float().mean().item() >= exact, diff
    assert diff.max().item() <= most * (want.max() - want.min()).item(), diff


def _centred_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative L2 distance of the logits about their means: how much of the pairs' differences moved."""
    g, w = got - got.mean(), want - want.mean()
    return ((g - w).norm() / w.norm()).item()


@pytest.mark.parametrize("kind", KINDS)
def test_fp8_scores_stay_near_the_fp32_model(dirs, kind, one_thread):
    prompts, segments = _pairs(kind, n=48, seed=1)
    fp32 = torch.tensor(_replica(dirs[kind], torch.float32).score(prompts, segments))
    bf16 = torch.tensor(_replica(dirs[kind]).score(prompts, segments))
    rep = _replica(dirs[kind])
    rep.to_fp8()
    got = torch.tensor(rep.score(prompts, segments))
    # Measured on these 48 pairs (centred relative L2 to fp32): bf16 0.042 / 0.050 / 0.098, fp8
    # 0.35 / 0.45 / 0.40 (xlmr / bert / electra; correlation 0.94 / 0.90 / 0.92). Random tiny
    # weights differ between pairs by little, so the quantization's ~3 % per GEMM is a large share
    # of it (a trained model's pairs differ by far more: the gate judges that). With every weight
    # scale doubled (a calibration bug): 1.43 / 1.13 / 0.83, correlation 0.30 / 0.47 / 0.67.
    assert _centred_error(bf16, fp32) < 0.15
    assert _centred_error(got, fp32) < 0.6
    assert torch.corrcoef(torch.stack([got.flatten(), fp32.flatten()]))[0, 1].item() > 0.85
    assert not torch.equal(got, bf16)  # the GEMMs really ran in FP8


def test_the_region_picker_never_uses_a_kernel_that_computes_something_else(dirs):
    layer = _replica(dirs["xlmr"])._layers[0]
    inputs, ref = encoder_fp8.region_inputs(48, layer, CPU), encoder_fp8.reference(layer.act)
    calls: list[str] = []

    def named(name: str, fn):
        def f(*a):
            calls.append(name)
            return fn(*a)

        return f

    def ln_double_scale(*a):  # a kernel that stores twice the scale it quantized with
        h, q, s = ref[0](*a)
        return h, q, s * 2

    def ln_no_padding_zeroed(delta, bias, h, w, b, eps, real):  # forgot real_rows: padding rows not zeroed
        return ref[0](delta, bias, h, w, b, eps, torch.ones_like(real))

    def act_without_bias(up, bias):
        return ref[1](up, torch.zeros_like(bias))

    def raises(x):
        raise RuntimeError("no kernel image for this GPU")

    cands = {
        "layernorm": {
            "ref": named("ref", ref[0]),
            "double": named("wrong", ln_double_scale),
            "padding": named("wrong", ln_no_padding_zeroed),
        },
        "act": {"no bias": named("wrong", act_without_bias), "ref": named("ref", ref[1])},
        "quant": {"raises": raises, "ref": named("ref", ref[2])},
    }
    ms = {"ref": 3.0, "wrong": 0.5}

    def timer(call) -> float:
        calls.clear()
        call()
        return ms[calls[0]]

    _, info = fp8.pick_each(
        cands,
        lambda r, fn: encoder_fp8.region_error(r, fn, ref, inputs, layer.act),
        lambda r, fn: encoder_fp8._call(r, fn, inputs),
        timer,
    )
    assert {r: v["kernel"] for r, v in info.items()} == {"layernorm": "ref", "act": "ref", "quant": "ref"}
    rows = info["layernorm"]["candidates"]
    assert rows["double"]["rel_err"] > 0.5 and rows["padding"]["excess"] > fp8.REGION_EXCESS
    assert "ms" not in rows["double"] and info["layernorm"]["candidates"]["ref"]["ms"] == 3.0
    assert info["act"]["candidates"]["no bias"]["excess"] > fp8.REGION_EXCESS
    assert "RuntimeError" in info["quant"]["candidates"]["raises"]["error"]
    with pytest.raises(RuntimeError, match="no kernel computes the layernorm region"):
        fp8.pick_each(
            {"layernorm": {"double": ln_double_scale}},
            lambda r, fn: encoder_fp8.region_error(r, fn, ref, inputs, layer.act),
            lambda r, fn: encoder_fp8._call(r, fn, inputs),
            None,
        )
    # The replica's own pick on CPU: the eager references, each checked (error 0)
    _, info = encoder_fp8.pick(encoder_fp8.candidates(layer.act, False, False), ref, layer, CPU)
    assert {r: v["kernel"] for r, v in info.items()} == dict.fromkeys(encoder_fp8.REGIONS, "eager")
    assert all(v["candidates"]["eager"] == {"rel_err": 0, "excess": 0} for v in info.values())


def _triton_check(*args: str, interpret: bool) -> dict:
    """tests/encoder_fp8_triton_check.py in a process of its own (TRITON_INTERPRET must precede Triton's import)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    p = subprocess.run(
        [sys.executable, "-m", "tests.encoder_fp8_triton_check", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    if not interpret and p.returncode != 0 and "ptxas" in p.stderr and "not found" in p.stderr.lower():
        pytest.skip("this Triton wheel has no ptxas")
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_triton_kernels_compute_the_torch_regions():
    """encoder_fp8_triton's kernels under Triton's interpreter, judged as the picker judges them."""
    got = _triton_check(interpret=True)
    names = {"layernorm:gelu", "act:gelu", "act:gelu_pytorch_tanh", "act:relu"}
    assert set(got) == names | {f"{n}:recip" for n in names}
    for name, r in got.items():
        # measured: 0 (LayerNorm, ReLU), 5.7e-7 (erf GELU: 2 of 7,400 e4m3 values one step apart,
        # another erf polynomial), 4.4e-7 (tanh GELU: 1 value); the picker's bound is on "excess".
        # The reciprocal variants (a product for the division) round more values on an e4m3
        # boundary the other way (measured 2-18 of 7,400, rel_err <= 4.1e-3) while no farther from
        # the exact values (excess <= 1.7e-4).
        recip = name.endswith(":recip")
        assert r["rel_err"] <= (1e-2 if recip else 1e-5), (name, r)
        assert r["excess"] <= fp8.REGION_EXCESS and r["nonfinite"] == 0, (name, r)
        assert r["values_differing"] <= r["values"] // (200 if recip else 1000), (name, r)
    assert got["layernorm:gelu"]["padding_zero"] and got["layernorm:gelu:recip"]["padding_zero"]


@pytest.mark.slow
def test_triton_kernels_compile_for_the_h200():
    got = _triton_check("--compile-sm90", interpret=False)
    names = {"ln_q", "act_q:gelu", "act_q:gelu_tanh", "act_q:relu"}
    assert set(got) == names | {f"{n}:recip" for n in names}
    assert all(r["cubin_bytes"] > 0 and r["cvt_e4m3"] > 0 for r in got.values()), got


# -- config and engine ---------------------------------------------------------------------------


def test_config_takes_fp8_for_cross_encoders_and_still_reads_dtype_aliases():
    assert PackedEngineConfig(name="x", family="cross-encoder", precision="fp8").precision == "fp8"
    bf16 = PackedEngineConfig(name="x", family="cross-encoder", precision="bf16")
    assert (bf16.precision, bf16.dtype) == ("auto", "bfloat16")
    with pytest.raises(ValueError, match="parity_set is the golden set of the FP8 ranking gate"):
        PackedEngineConfig(name="x", family="cross-encoder", parity_set="g.jsonl")


def _config(path: Path, **kw) -> PackedEngineConfig:
    return PackedEngineConfig(name="p", path=str(path), devices=("cpu",), batch_tokens=400, **kw)


@pytest.fixture
def small_golden_set(monkeypatch):
    """12 queries x 12 documents: the gate's code path in seconds on 2 CPU cores (the real set is 100 x 30)."""
    monkeypatch.setattr(gate, "GOLDEN_QUERIES", 12)
    monkeypatch.setattr(gate, "GOLDEN_DOCS", 12)


async def _scores(engine, docs: list[str]) -> list[float]:
    tok = engine.tokenizer
    job = ScoreJob(query=Q, instruction="", shared_ids=tok.encode_shared(Q, ""), item_ids=tok.encode_documents(docs))
    return (await engine.score(job)).scores


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["xlmr", "bert"])
async def test_fp8_engine_serves_with_the_gate_warned(dirs, kind, small_golden_set):
    bf16 = build_engine(_config(dirs[kind], dtype="bfloat16"))
    await bf16.start()
    try:
        want = await _scores(bf16, list(DOCS))
    finally:
        await bf16.stop()
    eng = build_engine(_config(dirs[kind], precision="fp8", precision_gate="warn"))
    await eng.start()
    try:
        got = await _scores(eng, list(DOCS))
        stats = eng.stats()
    finally:
        await eng.stop()
    precision = stats["precision"]
    assert precision["mode"].startswith("fp8 e4m3") and set(precision["gemms"]) == set(encoder_fp8.GEMMS)
    assert all(k.startswith("emulated") for k in precision["gemms"].values()), precision
    assert {r: v["kernel"] for r, v in precision["quantizing_regions"].items()} == dict.fromkeys(
        encoder_fp8.REGIONS, "eager"
    )
    assert precision["gate"]["queries"] == 12 and precision["gate"]["precision"] == "fp8"
    assert stats["gelu_epilogue"] is None  # the activation runs in the quantizing region
    assert got != want and max(abs(a - b) for a, b in zip(got, want, strict=True)) < 0.1  # sigmoid scores


@pytest.mark.anyio
async def test_fp8_engine_refuses_when_the_gate_fails(dirs, small_golden_set):
    # Random weights have no ranking to keep: the gate measures noise and refuses (the default).
    eng = build_engine(_config(dirs["electra"], precision="fp8"))
    with pytest.raises(EngineConfigError) as info:
        await eng.start()
    await eng.stop()
    msg = str(info.value)
    assert "\n" not in msg and "precision = 'fp8'" in msg and "refused" in msg and "golden queries" in msg


@pytest.mark.anyio
async def test_a_device_without_an_fp8_gemm_refuses_the_model(dirs, monkeypatch, small_golden_set):
    """Qwen3's rule (fp8_gemm.pick_mm: no GEMM computes the emulation's result on this device), as a config error."""

    def no_gemm(device, shape, dtype, bias=False):
        raise RuntimeError(f"precision = 'fp8': no FP8 GEMM works on {device} ({{}})")

    monkeypatch.setattr(fp8_gemm, "pick_mm", no_gemm)
    eng = build_engine(_config(dirs["bert"], precision="fp8", precision_gate="warn"))
    with pytest.raises(EngineConfigError, match="model 'p': precision = 'fp8': no FP8 GEMM works on cpu"):
        await eng.start()
    await eng.stop()


def test_check_config_passes_fp8_on_bert_style_checkpoints(dirs):
    from gateway.launch.preflight import preflight
    from schemas.config import Settings

    for kind in KINDS:
        settings = Settings(models=(PackedEngineConfig(name="p", path=str(dirs[kind]), precision="fp8"),))
        assert not [f.message for f in preflight(settings).findings if f.refuses], kind


@pytest.mark.anyio
async def test_fp8_refuses_modernbert_and_a_dtype_other_than_bf16(dirs):
    eng = build_engine(_config(dirs["modernbert"], precision="fp8"))
    with pytest.raises(EngineConfigError, match="ModernBERT's layers .* have no FP8 forward yet"):
        await eng.start()
    await eng.stop()
    eng = build_engine(_config(dirs["xlmr"], precision="fp8", dtype="float32"))
    with pytest.raises(EngineConfigError, match="runs the rest of the model in bfloat16"):
        await eng.start()
    await eng.stop()
