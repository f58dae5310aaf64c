"""The window of encoders that number positions from the padding index + 1 (as RoBERTa does):
MPNet (all-mpnet-base-v2 and its cross-encoders; its padding index is 1 whatever the config
says), XLM-R XL, Data2Vec-text, RoBERTa-PreLayerNorm... A window of ``max_position_embeddings``
ran rows past the last position embedding: torch fails (IndexError), OpenVINO's gather answers
a score anyway. Checkpoints whose tokenizer sets no ``model_max_length`` got that window."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from adapters.families.detect import ModelFiles
from adapters.families.layout import checkpoint_window

_NO_LIMIT = SimpleNamespace(model_max_length=10**30)  # a tokenizer_config.json without model_max_length


@pytest.mark.parametrize(
    ("model_type", "pad", "window"),
    [
        ("roberta", 1, 512),
        ("xlm-roberta", 1, 512),
        ("mpnet", 1, 512),
        ("mpnet", 0, 512),  # MPNet's padding index is 1 in transformers whatever pad_token_id says
        ("xlm-roberta-xl", 1, 512),
        ("data2vec-text", 1, 512),
        ("roberta-prelayernorm", 1, 512),
        ("bert", 0, 514),
    ],
)
def test_position_offset_of_padding_numbered_encoders(model_type, pad, window):
    files = ModelFiles(path="m", config={"model_type": model_type, "max_position_embeddings": 514, "pad_token_id": pad})
    assert checkpoint_window(files, _NO_LIMIT) == window


def test_a_tiny_mpnet_never_runs_past_its_positions(tmp_path):
    """End to end: the transformers model accepts every row the window lets through."""
    import json
    import shutil

    torch = pytest.importorskip("torch")
    from transformers import MPNetConfig, MPNetForSequenceClassification

    from adapters.families import create_family
    from schemas.config import OpenVinoEngineConfig
    from tests.tiny_encoders import build_tiny_cross_encoder

    bert = build_tiny_cross_encoder(tmp_path / "bert")
    out = tmp_path / "mpnet"
    out.mkdir()
    shutil.copy(bert / "tokenizer.json", out / "tokenizer.json")
    tc = json.loads((bert / "tokenizer_config.json").read_text())
    tc.pop("model_max_length", None)
    tc["model_input_names"] = ["input_ids", "attention_mask"]
    (out / "tokenizer_config.json").write_text(json.dumps(tc))
    torch.manual_seed(0)
    cfg = MPNetConfig(
        vocab_size=400,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=514,
        pad_token_id=0,
        num_labels=1,
    )
    MPNetForSequenceClassification(cfg).save_pretrained(out)
    family = create_family(OpenVinoEngineConfig(name="m", path=str(out)), "openvino")
    tok = family.load_tokenizer()
    shared = tok.encode_shared("capital", "")
    item = tok.encode_documents(["the capital of france is paris " * 200])[0][: tok.item_room(shared)]
    row = family.rows(SimpleNamespace(shared_ids=shared, item_ids=[item]))[0]
    family.load_torch(torch.device("cpu"), torch.float32)
    with torch.inference_mode():
        assert family.forward([row]).shape == (1, 1)
