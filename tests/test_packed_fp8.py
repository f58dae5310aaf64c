"""FP8 (e4m3) GEMMs of the packed engine on CPU: the arithmetic against a dequantized reference,
the fused regions, and the ranking gate that refuses a quantization which moves bf16's top-10 order.

CPU has no FP8 GEMM unit: the engine runs the same arithmetic emulated (fp8 values, fp32
products); the reference here is written independently, in float64, from e4m3 casts.
"""

from __future__ import annotations

import json

import pytest
import torch

from adapters.base import EngineConfigError, ScoreJob
from adapters.runtimes.packed import fp8, fp8_gemm, gate, kernels
from adapters.runtimes.packed.engine import PackedQwen3Engine
from adapters.runtimes.parity import GoldenQuery
from schemas.config import DEFAULT_INSTRUCTION, PackedEngineConfig


def _e4m3_reference(x: torch.Tensor) -> torch.Tensor:
    """x after a per-row e4m3 round trip, returned in float64: scale = row amax / 448 (the division in
    fp32, as the GPU kernels do it: in float64 a value on a rounding tie may round the other way)."""
    xf = x.to(torch.float32)
    s = xf.abs().amax(dim=-1, keepdim=True) / 448.0
    return (xf / s).to(torch.float8_e4m3fn).to(torch.float64) * s.to(torch.float64)


def test_quantize_rows_is_a_per_row_e4m3_round_trip():
    x = torch.randn(64, 96, dtype=torch.bfloat16) * torch.logspace(-3, 2, 64)[:, None]
    q, s = fp8_gemm.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 1) and s.dtype == torch.float32
    got = q.to(torch.float64) * s.to(torch.float64)
    torch.testing.assert_close(got, _e4m3_reference(x), rtol=1e-6, atol=0)
    assert q.to(torch.float32).abs().amax(dim=-1).eq(448).all()  # each row's largest value uses the whole range
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of itself (relative), none exact in general
    rel = ((got - x.double()).abs() / x.double().abs().clamp_min(1e-30))[x.double().abs() > s.double() * 2**-6]
    assert rel.max() <= 2**-4 and rel.mean() > 1e-3
    assert fp8_gemm.quantize_rows(torch.zeros(2, 8))[0].to(torch.float32).eq(0).all()  # no inf/nan from a zero row


@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 48), (37, 128, 96), (300, 256, 512)])
def test_fp8_gemm_equals_the_dequantized_reference(m, k, n):
    torch.manual_seed(m)
    x, w = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16) / k**0.5
    wq = fp8_gemm.quantize_weight(w)
    assert (
        wq.qt.shape == (k, n) and wq.qt.stride() == (1, k) and wq.scale.shape == (1, n)
    )  # column-major, as the kernels want
    xq, xs = fp8_gemm.quantize_rows(x)
    got = fp8_gemm.mm_emulated(xq, xs, wq, torch.float32)
    want = _e4m3_reference(x) @ _e4m3_reference(w).T  # per-channel weight scales = rows of (out, in)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # ... and it is FP8: a few percent from the exact product (the issue measured 3.7e-2 on the H200)
    exact = x.double() @ w.double().T
    err = ((got.double() - exact).norm() / exact.norm()).item()
    assert 5e-3 < err < 8e-2
    assert fp8_gemm.mm_emulated(xq, xs, wq, torch.bfloat16).dtype == torch.bfloat16


def test_scaled_mm_matches_the_emulation_where_it_runs():
    x, w = torch.randn(32, 64), torch.randn(48, 64) / 8
    xq, xs = fp8_gemm.quantize_rows(x)
    wq = fp8_gemm.quantize_weight(w)
    try:
        got = fp8_gemm.mm_torch(xq, xs, wq, torch.bfloat16)
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"torch._scaled_mm has no CPU kernel in this build: {exc}")
    torch.testing.assert_close(got.float(), fp8_gemm.mm_emulated(xq, xs, wq, torch.float32), rtol=1e-2, atol=1e-2)


def test_regions_quantize_what_the_bf16_regions_produce():
    torch.manual_seed(1)
    h, delta = torch.randn(20, 64, dtype=torch.bfloat16), torch.randn(20, 64, dtype=torch.bfloat16)
    w = torch.rand(64, dtype=torch.bfloat16) + 0.5
    q, s = fp8.rms_q(h, w, 1e-6)
    torch.testing.assert_close(q.double() * s.double(), _e4m3_reference(kernels.rms(h, w, 1e-6)), rtol=1e-6, atol=0)
    h2, q, s = fp8.add_rms_q(h, delta, w, 1e-6)
    ref_h, ref_x = kernels.add_rms(h, delta, w, 1e-6)
    assert torch.equal(h2, ref_h)  # the residual stream is not quantized
    torch.testing.assert_close(q.double() * s.double(), _e4m3_reference(ref_x), rtol=1e-6, atol=0)
    gu = torch.randn(20, 128, dtype=torch.bfloat16)
    q, s = fp8.silu_mul_q(gu)
    torch.testing.assert_close(q.double() * s.double(), _e4m3_reference(kernels.silu_mul(gu)), rtol=1e-6, atol=0)


def test_pick_mm_on_cpu_is_the_emulation():
    name, mm, info = fp8_gemm.pick_mm(torch.device("cpu"), (16, 32, 32), torch.bfloat16)
    assert mm is fp8_gemm.mm_emulated and "emulated" in name and info == {}


def test_gate_counts_queries_whose_top10_order_is_kept():
    base = [[float(i) for i in range(30)] for _ in range(100)]
    same = [list(b) for b in base]
    assert gate.judge("fp8", base, same, tie=0).kept == 1.0
    swapped = [list(b) for b in base]
    swapped[0][29], swapped[0][28] = swapped[0][28], swapped[0][29]  # first and second place trade
    assert gate.judge("fp8", base, swapped, tie=0).kept == 0.99 and gate.judge("fp8", base, swapped, tie=0).passed
    swapped[1][20], swapped[1][21] = swapped[1][21], swapped[1][20]  # 10th and 11th trade: top-10 changes
    result = gate.judge("fp8", base, swapped, tie=0)
    assert result.kept == 0.98 and not result.passed
    assert gate.judge("fp8", base, swapped, tie=0, min_agreement=0.98).passed  # parity_min_agreement
    below = [list(b) for b in base]
    below[2][0], below[2][1] = below[2][1], below[2][0]  # below the top 10: does not count
    assert gate.judge("fp8", base, below, tie=0).kept == 1.0
    with pytest.raises(ValueError):
        gate.judge("fp8", base, base[:3])


def test_gate_lets_documents_bf16_cannot_tell_apart_trade_places():
    # Scores 0.01 apart: two neighbours trading places is a change under a tie of 0.005, not under
    # 0.015 (parity_tie); a document sinking two places (past one 0.02 below it) is under both ...
    base = [[i / 100 for i in range(30)] for _ in range(10)]
    near = [list(b) for b in base]
    for q in near:
        q[29], q[28] = q[28], q[29]
    assert gate.judge("fp8", base, near, tie=0.005).kept == 0.0
    assert gate.judge("fp8", base, near, tie=0.015).kept == 1.0
    far = [list(b) for b in base]
    for q in far:
        q[29] = 0.265  # from first to third
    assert gate.judge("fp8", base, far, tie=0.015).kept == 0.0
    # ... and a score that turns NaN is always one (sorting would leave it in place).
    nan = [list(b) for b in base]
    nan[0][29] = float("nan")
    result = gate.judge("fp8", base, nan)
    assert result.kept == 0.9 and result.max_abs_diff == float("inf")


def test_golden_set_is_fixed_and_graded_one_by_one():
    a, b = gate.golden_set(), gate.golden_set()
    assert a == b and len(a) == gate.GOLDEN_QUERIES and all(len(q.documents) == gate.GOLDEN_DOCS for q in a)
    assert gate.golden_set(5) == a[:5]  # a test's smaller set is the real one's first queries
    for q in a[:20]:
        topic = (
            q.query.removeprefix("which documents mention ").rstrip("?").replace(",", "").replace(" and ", " ").split()
        )
        assert len(set(topic)) == gate.GRADES
        words = [d.rstrip(".").split() for d in q.documents]
        assert {len(w) for w in words} == {gate.DOC_WORDS}  # relevance is density, not length
        # the 10 best differ one by one (10, 9, ... 1 of the query's words); the rest hold none
        assert [len(set(w) & set(topic)) for w in words] == [
            *range(gate.GRADES, 0, -1),
            *[0] * (gate.GOLDEN_DOCS - gate.GRADES),
        ]


# -- the engine, end to end on the tiny checkpoint ---------------------------------------------


def _cfg(tiny_dir, **kw) -> PackedEngineConfig:
    return PackedEngineConfig(name="p", path=str(tiny_dir), max_length=512, max_query_tokens=64, **kw)


async def _scores(eng: PackedQwen3Engine, docs: list[str]) -> list[float]:
    tok = eng.tokenizer
    job = ScoreJob(
        query="capital?",
        instruction=DEFAULT_INSTRUCTION,
        shared_ids=tok.encode_shared("capital?", DEFAULT_INSTRUCTION),
        item_ids=tok.encode_documents(docs),
    )
    return (await eng.score(job)).scores


DOCS = ["Paris is the capital of France.", "Quantum computing uses qubits.", "no", "Click Settings. " * 9]


@pytest.fixture
def small_golden_set(monkeypatch):
    """12 queries x 12 documents: the gate's code path, in seconds on 2 CPU cores (the real set is 100 x 30)."""
    monkeypatch.setattr(gate, "GOLDEN_QUERIES", 12)
    monkeypatch.setattr(gate, "GOLDEN_DOCS", 12)


@pytest.mark.slow
@pytest.mark.anyio
async def test_fp8_engine_scores_near_bf16_and_reports_its_gate(tiny_qwen3_dir, tmp_path):
    bf16 = PackedQwen3Engine(_cfg(tiny_qwen3_dir, dtype="bfloat16"))
    await bf16.start()
    try:
        want = await _scores(bf16, DOCS)
    finally:
        await bf16.stop()
    # The operator's own golden set (parity_set), one document far longer than the 512-token window.
    own = [
        GoldenQuery(f"capital of country {i}?", [*DOCS, "Click Settings. " * 400, *(f"city {j}" for j in range(8))])
        for i in range(3)
    ]
    golden = tmp_path / "golden.jsonl"
    golden.write_text("".join(json.dumps({"query": q.query, "documents": q.documents}) + "\n" for q in own))
    eng = PackedQwen3Engine(
        _cfg(
            tiny_qwen3_dir,
            precision="fp8",
            precision_gate="warn",
            parity_set=str(golden),
            parity_tie=0.01,
            parity_min_agreement=0.5,
        )
    )
    await eng.start()
    try:
        got = await _scores(eng, DOCS)
        stats = eng.stats()["precision"]
    finally:
        await eng.stop()
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 0.03
    assert got != want  # the GEMMs really ran in FP8
    assert stats["gemm"].startswith("emulated")
    assert {k: stats["gate"][k] for k in ("golden", "queries", "tie", "min_agreement")} == {
        "golden": str(golden),
        "queries": 3,
        "tie": 0.01,
        "min_agreement": 0.5,
    }
    assert {r: v["kernel"] for r, v in stats["quantizing_regions"].items()} == {
        "norm": "eager",
        "silu_mul": "eager",
        "quant": "eager",
    }
    assert 0 < stats["gate"]["max_abs_diff"] < 0.05
    print("tiny checkpoint, fp8 gate:", stats["gate"])


@pytest.mark.slow
@pytest.mark.anyio
async def test_gate_refuses_a_bad_quantization_in_one_line(tiny_qwen3_dir, monkeypatch, small_golden_set):
    def saturating(w: torch.Tensor) -> fp8_gemm.Fp8Weight:
        # A scale 64x too small (a classic calibration bug): the larger weights clip at +-448.
        s = w.float().abs().amax(dim=-1, keepdim=True) / 448 / 64
        q = (w.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn)
        return fp8_gemm.Fp8Weight(q.t(), s.t().contiguous())

    monkeypatch.setattr(fp8_gemm, "quantize_weight", saturating)
    eng = PackedQwen3Engine(_cfg(tiny_qwen3_dir, precision="fp8"))
    with pytest.raises(EngineConfigError) as info:
        await eng.start()
    msg = str(info.value)
    assert "\n" not in msg and "precision = 'fp8'" in msg and "refused" in msg and "golden queries" in msg
    await eng.stop()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "No such file"),
        ('{"query": "q"}\n', "expected"),
        ('{"query": "q", "documents": ["a", "b"]}\n', "at least 10"),
    ],
)
def test_a_bad_parity_set_refuses_the_model_in_one_line_before_it_loads(
    tiny_qwen3_dir, tmp_path, monkeypatch, content, says
):
    path = tmp_path / "golden.jsonl"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr("adapters.runtimes.packed.engine.load_backbone", lambda *a: pytest.fail("weights loaded"))
    eng = PackedQwen3Engine(_cfg(tiny_qwen3_dir, precision="fp8", parity_set=str(path)))
    with pytest.raises(EngineConfigError) as info:
        eng._load()
    msg = str(info.value)
    assert "\n" not in msg and "parity_set" in msg and says in msg and str(path) in msg


@pytest.mark.parametrize("share", [True, False])
def test_the_gate_cuts_a_golden_document_longer_than_the_window(tiny_qwen3_dir, share):
    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
    from adapters.runtimes.packed.engine import _golden_scores

    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny_qwen3_dir), None), max_length=256, max_query_tokens=64)
    seen: list[int] = []

    class Recorder:  # the replica's two entry points; records each prompt's length
        def score(self, prompts):
            seen.extend(len(p) for p in prompts)
            return [0.5] * len(prompts)

        def score_groups(self, groups):
            return self.score([[*pre, *t] for pre, tails in groups for t in tails])

    golden = [GoldenQuery("capital?", ["Click Settings. " * 200, *DOCS, *(f"city {j}" for j in range(6))])]
    scores = _golden_scores(Recorder(), tok, 4096, share, golden)
    assert [len(q) for q in scores] == [11] and len(seen) == 11
    assert max(seen) == 256  # the long document filled the window, no more


@pytest.mark.parametrize(
    ("configured", "used"), [(None, DEFAULT_INSTRUCTION), ("Find similar text.", "Find similar text.")]
)
def test_the_gate_scores_with_the_instruction_a_request_gets(tiny_qwen3_dir, monkeypatch, configured, used):
    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
    from adapters.runtimes.packed import engine as packed_engine

    seen: list[str] = []

    def golden_scores(replica, prompt, batch_tokens, share, golden, instruction=DEFAULT_INSTRUCTION):
        seen.append(instruction)
        return [[float(i) for i in range(len(g.documents))] for g in golden]

    class Replica:
        def to_fp8(self) -> None:
            """Quantizing is left out: the test reads which instruction the two passes got."""

    monkeypatch.setattr(packed_engine, "_golden_scores", golden_scores)
    monkeypatch.setattr(packed_engine, "_warm_up", lambda *a: None)
    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny_qwen3_dir), None), max_length=512, max_query_tokens=64)
    cfg = _cfg(tiny_qwen3_dir, precision="fp8", instruction=configured)
    assert packed_engine._to_fp8([Replica()], tok, cfg, True, gate.golden_set(2)).passed
    assert seen == [used, used]  # bf16's pass and FP8's


def test_parity_set_is_read_only_with_fp8(tiny_qwen3_dir):
    with pytest.raises(ValueError, match="parity_set is the golden set of the FP8 ranking gate"):
        _cfg(tiny_qwen3_dir, parity_set="/tmp/golden.jsonl")


def test_fp8_needs_bf16_for_the_rest(tiny_qwen3_dir):
    eng = PackedQwen3Engine(_cfg(tiny_qwen3_dir, precision="fp8", dtype="float32"))
    with pytest.raises(EngineConfigError, match="bfloat16"):
        eng._load()


# -- the quantizing regions' kernels: Triton's arithmetic, and which kernel the engine picks ---------


@pytest.mark.slow
def test_triton_kernels_compute_the_torch_regions_bit_for_bit():
    """fp8_triton's kernels under Triton's interpreter (own process: TRITON_INTERPRET must precede the import)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    p = subprocess.run(
        [sys.executable, "-m", "tests.fp8_triton_check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    names = {"rms_q", "add_rms_q", "silu_mul_q", "quant", "quant_strided"}
    assert set(got) == names | {f"{n}:recip" for n in names}
    for region, r in got.items():
        # the reciprocal variant (a product for the division per value) rounds a value on an e4m3
        # boundary the other way now and then: measured 0-3 of 1,520-2,432; the scales are the same
        most = r["values"] // 200 if region.endswith(":recip") else 0
        assert r["values_differing"] <= most and r["scale_max_rel"] == 0 and r["nonfinite"] == 0, (region, r)
        assert r.get("residual_max_abs", 0) == 0, (region, r)


@pytest.mark.slow
def test_triton_kernels_compile_for_the_h200():
    """PTX and cubin for sm_90 with the Triton wheel's ptxas (no GPU): e4m3 conversions in, no approximate division."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run(
        [sys.executable, "-m", "tests.fp8_triton_check", "--compile-sm90"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    if p.returncode != 0 and "ptxas" in p.stderr and "not found" in p.stderr.lower():
        pytest.skip("this Triton wheel has no ptxas")
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    names = {"add_rms_q", "rms_q", "silu_mul_q", "quant"}
    assert set(got) == names | {f"{n}:recip" for n in names}
    for name, r in got.items():
        assert r["cubin_bytes"] > 0 and r["cvt_e4m3"] > 0 and r["div_rn"] > 0, (name, r)
        if not name.endswith(":recip"):  # the exact variant: IEEE divisions only
            assert r["div_approx"] == 0, (name, r)
        else:  # one division per row (scale and reciprocal), none per value, but silu's fast one
            assert r["div_rn"] < got[name.removesuffix(":recip")]["div_rn"], (name, r)
    assert got["silu_mul_q:recip"]["div_approx"] > 0 and got["quant:recip"]["div_approx"] == 0


def _region_inputs(tokens: int = 48) -> dict[str, torch.Tensor]:
    w = (torch.rand(64) + 0.5).to(torch.bfloat16)
    return fp8.region_inputs(tokens, 64, 96, 128, w, torch.device("cpu"), torch.bfloat16)


def test_pick_regions_takes_the_fastest_kernel_that_computes_the_reference():
    calls: list[str] = []

    def named(name: str, fn):
        def f(*a):
            calls.append(name)
            return fn(*a)

        return f

    def wrong_scale(x):  # a kernel that forgot the /448: every value saturates or rounds away
        q, s = fp8.quant(x)
        return q, s * 448

    def raises(x):
        raise RuntimeError("no kernel image for this GPU")

    ms = {"ref": 3.0, "fast": 2.0, "wrong": 0.5, "raises": 0.1}
    cands = {
        "norm": {"ref": fp8.REFERENCE[:2], "fast": (named("fast", fp8.rms_q), named("fast", fp8.add_rms_q))},
        "silu_mul": {"ref": fp8.silu_mul_q, "wrong": lambda x: wrong_scale(kernels.silu_mul(x))},
        "quant": {"raises": raises, "ref": named("ref", fp8.quant), "wrong": named("wrong", wrong_scale)},
    }

    def timer(call) -> float:
        calls.clear()
        call()
        return ms[calls[0]] if calls else ms["ref"]

    regions, info = fp8.pick_regions(cands, _region_inputs(), 1e-6, timer)
    assert [info[r]["kernel"] for r in ("norm", "silu_mul", "quant")] == ["fast", "ref", "ref"]
    assert regions[0] is cands["norm"]["fast"][0] and regions[3] is cands["quant"]["ref"]
    assert info["quant"]["candidates"]["wrong"]["rel_err"] > 0.5 and "ms" not in info["quant"]["candidates"]["wrong"]
    assert "RuntimeError" in info["quant"]["candidates"]["raises"]["error"]
    assert info["norm"]["candidates"]["fast"]["rel_err"] == 0 and info["norm"]["candidates"]["fast"]["ms"] == 2.0
    # a preferred family wins even when slower; one that has no correct kernel falls back, and says so
    _, info = fp8.pick_regions(cands, _region_inputs(), 1e-6, timer, choice="wrong")
    assert info["quant"]["kernel"] == "ref" and "no correct 'wrong' kernel" in info["quant"]["note"]
    _, info = fp8.pick_regions(
        {k: v for k, v in cands.items() if k != "norm"} | {"norm": {"ref": fp8.REFERENCE[:2]}},
        _region_inputs(),
        1e-6,
        timer,
        choice="ref",
    )
    assert info["quant"]["kernel"] == "ref" and "note" not in info["quant"]
    with pytest.raises(RuntimeError, match="no kernel computes the quant region"):
        fp8.pick_regions({"quant": {"wrong": wrong_scale}}, _region_inputs(), 1e-6, timer)


def test_vllm_in_place_residual_is_checked_on_a_copy():
    """vLLM's fused norm adds the residual in place: the check must not corrupt its own inputs."""
    inputs = _region_inputs()
    before = inputs["h"].clone()

    def in_place(h, delta, w, eps):
        h += delta
        return (h, *fp8.rms_q(h, w, eps))

    assert fp8.region_error("norm", (fp8.rms_q, in_place), inputs, 1e-6) == {"rel_err": 0, "excess": 0}
    assert torch.equal(inputs["h"], before)


# -- the gate on a checkpoint whose scores spread as a trained reranker's do --------------------------
# tests/tiny_qwen3_spread.py: P(yes) spans ~0.01..0.99 over the golden documents. Replicas are used
# directly (no engine start per case) and one torch thread: on 2 busy cores two threads ran the
# tiny model's small kernels ~10x slower.

SPREAD_QUERIES = 30  # of the gate's 100: the 30-document queries as they are, the code path in ~10 s per pass


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def spread(tmp_path_factory, one_thread):
    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
    from tests.tiny_qwen3_spread import build_tiny_qwen3_spread

    path = build_tiny_qwen3_spread(tmp_path_factory.mktemp("tiny-qwen3-spread"))
    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(path), None), max_length=512, max_query_tokens=64)
    return path, tok


def _replica(path, tok):
    from adapters.runtimes.packed.forward import PackedQwen3Replica, load_backbone

    backbone, head = load_backbone(str(path), None, torch.bfloat16, (tok.no_id, tok.yes_id))
    return PackedQwen3Replica(backbone, head, torch.device("cpu"), attention="sdpa", compile=False)


def _golden(rep, tok):
    from adapters.runtimes.packed.engine import _golden_scores

    return _golden_scores(rep, tok, 65536, True, gate.golden_set(SPREAD_QUERIES))  # as served (share_prefix default)


def _e5m2_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The deliberately bad quantization: e5m2 (2 mantissa bits, twice e4m3's rounding error) for weights and activations."""
    xf = x.to(torch.float32)
    s = xf.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / float(torch.finfo(torch.float8_e5m2).max)
    return (xf / s).to(torch.float8_e5m2), s


@pytest.fixture(scope="module")
def spread_scores(spread):
    """bf16, e4m3 and e5m2 golden-set scores of the spread checkpoint (each replica quantized from the same bf16 weights)."""
    path, tok = spread
    mp = pytest.MonkeyPatch()
    try:
        base = _golden(_replica(path, tok), tok)
        rep = _replica(path, tok)
        rep.to_fp8()
        e4m3 = _golden(rep, tok)
        mp.setattr(fp8, "quantize_rows", _e5m2_rows)  # weights (quantize_weight) and the regions' activations
        rep = _replica(path, tok)
        rep.to_fp8()
        e5m2 = _golden(rep, tok)
    finally:
        mp.undo()
    return base, e4m3, e5m2


@pytest.mark.slow
def test_spread_checkpoint_scores_span_the_probability_range(spread_scores):
    flat = torch.tensor([s for q in spread_scores[0] for s in q])
    lo, hi = torch.quantile(flat, torch.tensor([0.01, 0.99])).tolist()
    assert lo < 0.03 and hi > 0.97  # the plain tiny checkpoint: 0.5 +- a few hundredths
    assert ((flat < 0.2) | (flat > 0.8)).float().mean() > 0.3  # the plain one: none


@pytest.mark.slow
def test_fp8_replica_equals_a_dequantized_transformers_reference(spread, one_thread):
    """End to end on the spread checkpoint: the packed FP8 path against transformers' own Qwen3 code in bf16
    (which the bf16 replica equals exactly) with each linear layer computed from the FP8 values written out:
    input per token and weight per channel through e4m3 round trips, product in float64, result in bf16."""
    from transformers import AutoModelForCausalLM

    from tests.tiny_qwen3_spread import golden_prompts

    path, tok = spread
    prompts = golden_prompts(tok, 2)
    rep = _replica(path, tok)
    bf16 = rep.score(prompts)
    rep.to_fp8()
    got = rep.score(prompts)

    ref_model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    assert max(abs(a - b) for a, b in zip(bf16, _ref_scores(ref_model, tok, prompts), strict=True)) == 0
    for mod in ref_model.model.layers.modules():
        if isinstance(mod, torch.nn.Linear):
            w = _e4m3_reference(mod.weight.data)  # float64, per output channel
            mod.forward = lambda x, w=w: (
                (_e4m3_reference(x.reshape(-1, x.shape[-1])) @ w.T).reshape(*x.shape[:-1], -1).to(x.dtype)
            )
    want = _ref_scores(ref_model, tok, prompts)

    fp8_vs_ref = max(abs(a - b) for a, b in zip(got, want, strict=True))
    fp8_vs_bf16 = max(abs(a - b) for a, b in zip(got, bf16, strict=True))
    print(f"spread checkpoint, 60 prompts: |fp8 - dequantized ref| {fp8_vs_ref:.2e}, |fp8 - bf16| {fp8_vs_bf16:.4f}")
    assert fp8_vs_bf16 > 0.02  # quantization moved the scores ...
    assert fp8_vs_ref < 1e-3  # ... exactly as the reference did (float64 vs fp32 sums apart)


def _ref_scores(model, tok, prompts) -> list[float]:
    from tests.tiny_qwen3_spread import final_hidden

    x = final_hidden(model, prompts).float()
    head = model.lm_head.weight[[tok.no_id, tok.yes_id]].float()
    return torch.softmax(x @ head.T, dim=-1)[:, 1].tolist()


@pytest.mark.slow
def test_gate_on_the_spread_checkpoint_refuses_e5m2_and_ranks_it_below_e4m3(spread_scores):
    base, e4m3, e5m2 = spread_scores
    good, bad = gate.judge("fp8", base, e4m3), gate.judge("fp8", base, e5m2)
    print("spread checkpoint:", good.line(), "|", bad.line())
    assert not bad.passed and "\n" not in bad.line()
    # e5m2's rounding error is twice e4m3's: the gate's measures say it is the worse quantization
    assert bad.max_abs_diff > 1.4 * good.max_abs_diff and bad.mean_shared < good.mean_shared and bad.kept <= good.kept
    # A random checkpoint has no ranking to keep: it does not follow the golden documents' grades, its
    # 30 continuous scores per query have a top 10 a few hundredths of the spread apart, so e4m3's
    # rounding reorders the top 10 (the gate refuses it too; docs/engines-packed.md, FP8). The head's
    # scale changes no order: spreading the scores changes the probabilities, not the gate's verdict.
    assert not good.passed


def test_a_kernel_rounding_in_another_order_is_correct_and_a_wrong_scale_is_not():
    """On the H200 (2026-12-05) Inductor's compiled norm region and vLLM's fused op differed from
    the torch functions by 1.47e-2 / 1.44e-2 relative -- they quantize the normalized value without
    rounding it to bf16 first -- and the old rule (within 1e-2 of the torch functions) refused both,
    so the suite's "vLLM serves" check failed. Such a kernel is as close to the exact values as the
    torch functions are; one that stores twice its scale is not."""
    inputs = _region_inputs(tokens=1024)

    def unrounded_rms(x, w, eps):  # fp32 all the way to the quantization
        xf = x.float()
        return fp8_gemm.quantize_rows(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float())

    def unrounded_add_rms(h, delta, w, eps):
        h = h + delta
        return (h, *unrounded_rms(h, w, eps))

    row = fp8.region_error("norm", (unrounded_rms, unrounded_add_rms), inputs, 1e-6)
    assert row["rel_err"] > 1e-2  # far from the torch functions' values, as on the GPU
    assert row["excess"] <= fp8.REGION_EXCESS  # but no farther from the exact ones

    def twice_the_scale(x, w, eps):
        q, s = fp8.rms_q(x, w, eps)
        return q, 2 * s

    row = fp8.region_error("norm", (twice_the_scale, fp8.add_rms_q), inputs, 1e-6)
    assert row["excess"] > 10
    lost_residual = (fp8.rms_q, lambda h, delta, w, eps: fp8.add_rms_q(h, 0 * delta, w, eps))
    assert fp8.region_error("norm", lost_residual, inputs, 1e-6)["excess"] == float("inf")
