"""ModernBERT on engine ``packed``, what ``test_packed_encoders.py`` (scores against
sentence-transformers alone, mixed steps, concurrent requests, HTTP, compiled) does not show:
the replica's logits against plain transformers run padded (eager attention, one batch: an
independent implementation), with pairs several times longer than the local window, and the
parts a score check could miss.

The tiny checkpoints (``tests.tiny_encoders.build_tiny_modernbert``) have 4 layers, global
attention in layers 0 and 3 (RoPE theta 160k) and local attention (±8 tokens, theta 10k) in 1 and
2, and pairs of 15 to ~150 tokens: the window and the per-layer theta change the scores. One
pools "cls" with one label, the other "mean" with two labels and LayerNorm biases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_modernbert

TOL = 1e-5
KINDS = ("cls", "mean")
QUERIES = (Q, "capital punishment", "Which fox is quick and brown, and which dog is lazy?")
# Pairs of ~60-120 tokens (the tiny BPE splits words): well past the ±8 window.
LONG = [
    "Washington, D.C. is the capital of the United States. It is a federal district. " * 2,
    "Quantum computing uses qubits. Text rerank models are widely used in search engines. The capital of France is Paris.",
]
ALL_DOCS = [*DOCS, *LONG]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("packed-modernbert")
    return {
        "cls": build_tiny_modernbert(base / "cls", pooling="cls"),
        "mean": build_tiny_modernbert(base / "mean", pooling="mean", id2label={0: "irrelevant", 1: "relevant"}, seed=1),
    }


@pytest.fixture(scope="module")
def replicas(dirs):
    """(replica, tokenizer) per kind: the packed ModernBERT replica on CPU, fp32, eager."""
    import torch
    from transformers import AutoTokenizer

    from adapters.runtimes.packed.encoder_replicas import make_replica
    from adapters.runtimes.packed.pair_replica import load_cross_encoder

    return {
        kind: (
            make_replica(
                load_cross_encoder(str(d), None, torch.float32), torch.device("cpu"), attention="auto", compile=False
            ),
            AutoTokenizer.from_pretrained(d),
        )
        for kind, d in dirs.items()
    }


def _pairs(tok, queries, docs) -> list[list[int]]:
    return [tok(q, d)["input_ids"] for q in queries for d in docs]


def _padded_logits(path: Path, queries, docs) -> list[list[float]]:
    """Plain transformers, eager attention, all pairs in one right-padded batch (fp32)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    enc = tok([q for q in queries for _ in docs], [d for _ in queries for d in docs], padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits.tolist()


def test_the_pairs_outgrow_the_local_window(replicas):
    replica, tok = replicas["cls"]
    assert (
        replica.window == 8
        and replica.attention_name == "sdpa per sequence; local layers: sdpa per sequence, window ±8"
    )
    lens = [len(p) for p in _pairs(tok, [Q], ALL_DOCS)]
    assert max(lens) > 8 * replica.window and sum(n > 2 * replica.window + 1 for n in lens) >= 5, lens


@pytest.mark.parametrize("kind", KINDS)
def test_logits_of_one_mixed_step_equal_padded_transformers(replicas, dirs, kind):
    """Every query's pairs in one packed step against transformers' padded batch: raw logits, all labels."""
    replica, tok = replicas[kind]
    assert type(replica).__name__ == "PackedModernBertReplica" and replica.pooling == kind
    got = replica.score(_pairs(tok, QUERIES, ALL_DOCS))
    want = _padded_logits(dirs[kind], QUERIES, ALL_DOCS)
    assert [x for row in got for x in row] == pytest.approx([x for row in want for x in row], abs=TOL)
    firsts = [row[-1] for row in want]
    assert max(firsts) - min(firsts) > 0.1  # the tiny model really discriminates


def test_rope_positions_restart_for_each_pair(replicas, monkeypatch):
    """RoPE attention depends on i - j only, so a constant offset per pair hides from the scores in
    fp32 (it costs precision far into a long step, and a scaled RoPE type reads the positions
    themselves): the positions handed to the model's rotary module are checked directly."""
    replica, tok = replicas["cls"]
    seen = []
    rotary = replica._rotary

    def spy(x, position_ids, layer_type):
        seen.append((layer_type, position_ids.tolist()))
        return rotary(x, position_ids, layer_type)

    monkeypatch.setattr(replica, "_rotary", spy)
    rows = _pairs(tok, QUERIES, LONG)
    replica.score(rows)
    want = [[p for r in rows for p in range(len(r))]]
    assert sorted(t for t, _ in seen) == ["full_attention", "sliding_attention"]
    assert all(pos == want for _, pos in seen)


def test_banded_sdpa_equals_a_dense_masked_reference():
    """The CPU kernel of the local layers: |i - j| <= window, per sequence, as transformers' mask."""
    import torch

    from adapters.runtimes.packed import varlen

    name, attend = varlen.pick_attention("auto", torch.device("cpu"), causal=False, window=3)
    assert name == "sdpa per sequence, window ±3" and varlen.needs_lengths(attend)
    g = torch.Generator().manual_seed(0)
    lens = [11, 2, 4, 9]  # shorter than the band (no mask) and longer
    q, k, v = (torch.randn(sum(lens), 2, 16, generator=g) for _ in range(3))
    got = attend(q, k, v, None, None, None, None, lens, lens)
    want = []
    for qi, ki, vi in zip(q.split(lens), k.split(lens), v.split(lens), strict=True):
        pos = torch.arange(qi.shape[0])
        s = torch.einsum("qhd,khd->hqk", qi, ki) / 16**0.5
        s = s.masked_fill((pos[:, None] - pos[None, :]).abs() > 3, float("-inf"))
        want.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vi))
    assert torch.allclose(got, torch.cat(want), atol=1e-6)
    with pytest.raises(ValueError, match="bidirectional"):
        varlen.pick_attention("auto", torch.device("cpu"), causal=True, window=3)


def _unbanded_varlen(q, k, v, cu_q, cu_k, max_q, max_k, lens_q, lens_k):
    """A stand-in for a varlen kernel whose build ignores ``window_size`` (it reads only ``cu``)."""
    from adapters.runtimes.packed import varlen

    lens = (cu_q[1:] - cu_q[:-1]).tolist()
    return varlen.sdpa_per_sequence(q, k, v, cu_q, cu_k, max_q, max_k, lens, lens)


def test_a_varlen_kernel_is_checked_on_the_band_before_it_serves_local_layers(dirs, monkeypatch):
    """On CUDA the local layers' varlen kernel must compute the band: one that ignores the window
    (or raises) is replaced by the banded SDPA at start, and the scores stay transformers'."""
    import torch

    from adapters.runtimes.packed import picks, varlen
    from adapters.runtimes.packed.encoder_replicas import make_replica
    from adapters.runtimes.packed.pair_replica import load_cross_encoder

    cpu = torch.device("cpu")
    _, banded = varlen.pick_attention("sdpa", cpu, causal=False, window=8)
    assert picks.window_error(banded, "banded", cpu, torch.float32, 8) is None
    assert "not the band" in picks.window_error(_unbanded_varlen, "fake", cpu, torch.float32, 8)

    def broken(*args):
        raise RuntimeError("this build has no local attention")

    assert "RuntimeError: this build has no local attention" in picks.window_error(
        broken, "fake", cpu, torch.float32, 8
    )

    def pick(
        choice, device, kernel="auto", *, causal=True, dtype=None, window=None
    ):  # "auto" -> the fake varlen kernel
        if choice == "sdpa":
            return real_pick(choice, device, kernel, causal=causal, dtype=dtype, window=window)
        return ("fake varlen" + (f", window ±{window}" if window else ""), _unbanded_varlen)

    real_pick = varlen.pick_attention
    monkeypatch.setattr(varlen, "pick_attention", pick)
    replica = make_replica(
        load_cross_encoder(str(dirs["cls"]), None, torch.float32), cpu, attention="auto", compile=False
    )
    assert "not the band" in replica.window_error
    assert replica.attention_name.startswith(
        "fake varlen; local layers: sdpa per sequence, window ±8 (the varlen kernel"
    )
    from transformers import AutoTokenizer

    got = replica.score(_pairs(AutoTokenizer.from_pretrained(dirs["cls"]), [Q], ALL_DOCS))
    want = _padded_logits(dirs["cls"], [Q], ALL_DOCS)
    assert [r[0] for r in got] == pytest.approx([r[0] for r in want], abs=TOL)
