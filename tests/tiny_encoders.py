"""Tiny random encoder checkpoints with real trained tokenizers, built offline in seconds.

- BERT: WordPiece tokenizer with BERT's post-processor (``[CLS] a [SEP] b [SEP]``, token types
  0/1) and a fixed vocabulary, the same in every process (the corpus's words whole, its characters
  alone and as continuations), ``BertForSequenceClassification`` (a cross-encoder like ms-marco-MiniLM) or ``BertModel``
  plus sentence-transformers files (a bi-encoder like all-MiniLM).
- XLM-R: Unigram tokenizer with RoBERTa's post-processor (``<s> a </s></s> b </s>``, no token
  types), ``XLMRobertaForSequenceClassification`` (a cross-encoder like bge-reranker).
- ModernBERT: byte-level BPE tokenizer (as ModernBERT's own) with ``[CLS] a [SEP] b [SEP]`` and
  no token types, ``ModernBertForSequenceClassification`` (like gte-reranker-modernbert-base):
  4 layers, global attention every 3rd, a local window narrower than the test pairs.

Random weights give meaningless relevance but exact numbers to compare engines with. hidden 128
with 2 heads: vLLM's CPU attention needs a head size of at least 64.

Usable from the command line: ``python -m tests.tiny_encoders OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

_CORPUS = [
    "The capital of France is Paris. Berlin is the capital of Germany. Madrid is in Spain.",
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "What is the capital of the United States? How do I change my password? Click Settings.",
    "Quantum computing uses qubits. Text rerank models are widely used in search engines.",
    "The quick brown fox jumps over the lazy dog 0123456789 !?.,;:-_()[]{}'\"/\\@#$%^&*+=<>|~`",
]
_ENCODER = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 256,
    "initializer_range": 0.2,
}
CLASSIFIER_SCALE = 0.3


def _fixed_wordpiece_vocab(specials: list[str]) -> dict[str, int]:
    """A WordPiece vocabulary that is the same in every process: the corpus's words whole, and
    every character of it alone and as a continuation (``##c``), each group sorted. The trained
    one is not: the trainer breaks ties between equally frequent pairs in hash-map order, which
    Rust seeds per process, so two builds of one seed get different vocabularies (and scores)."""
    from tokenizers import normalizers, pre_tokenizers

    norm, pre = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = sorted({w for text in _CORPUS for w, _ in pre.pre_tokenize_str(norm.normalize_str(text))})
    chars = sorted({c for w in words for c in w})
    tokens = [*specials, *chars, *(f"##{c}" for c in chars), *(w for w in words if len(w) > 1)]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}


def _bert_tokenizer(out: Path, *, fixed_vocab: bool = True) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = _fixed_wordpiece_vocab(specials) if fixed_vocab else None
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    if not fixed_vocab:
        tok.train_from_iterator(
            _CORPUS * 20, trainer=trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials)
        )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
        # What BertTokenizer declares: pairs get token types 0/1.
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    fast.save_pretrained(out)
    return fast


def fix_unigram_order(tok: Any, specials: list[str], digits: int = 9) -> None:
    """Rebuild a trained Unigram model with its pieces in a fixed order: specials first (their ids
    kept), then by score and text, scores rounded to ``digits``.

    The Unigram trainer returns the same pieces with the same scores every run but orders tied ones
    differently, even on one thread: ids (so the embedding each token gets, and every score a test
    measures against a tolerance) would change from build to build.
    """
    from tokenizers import models

    trained = json.loads(tok.to_str())["model"]["vocab"]
    assert [p for p, _ in trained[: len(specials)]] == specials
    rest = sorted(((p, round(s, digits)) for p, s in trained[len(specials) :]), key=lambda ps: (-ps[1], ps[0]))
    tok.model = models.Unigram([(p, 0.0) for p in specials] + rest, unk_id=specials.index("<unk>"), byte_fallback=False)


def _xlmr_tokenizer(out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        _CORPUS * 20, trainer=trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="<unk>")
    )
    fix_unigram_order(tok, specials)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>"))
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
        model_max_length=512,
    )
    fast.save_pretrained(out)
    return fast


def _modernbert_tokenizer(out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # A small vocabulary: words split into several pieces, so the test pairs outgrow the local window.
    tok.train_from_iterator(
        _CORPUS * 20,
        trainer=trainers.BpeTrainer(
            vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
        model_input_names=["input_ids", "attention_mask"],
    )  # ModernBERT takes no token types
    fast.save_pretrained(out)
    return fast


def build_tiny_modernbert(
    out_dir: str | Path,
    *,
    pooling: str = "cls",
    id2label: dict[int, str] | None = None,
    seed: int = 0,
    local_attention: int = 16,
    layers: int = 4,
) -> Path:
    """A ``ModernBertForSequenceClassification`` cross-encoder in ``out_dir``: global attention in
    layers 0 and 3, local (±``local_attention // 2``) in the others; distinct RoPE thetas. One
    label unless ``id2label`` (named: transformers 5 leaves a default two-label map out of config.json)."""
    import torch
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast = _modernbert_tokenizer(out)
    torch.manual_seed(seed)
    cfg = ModernBertConfig(
        vocab_size=len(fast),
        hidden_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=192,
        max_position_embeddings=512,
        local_attention=local_attention,
        global_attn_every_n_layers=3,
        global_rope_theta=160000.0,
        local_rope_theta=10000.0,
        classifier_pooling=pooling,
        **({"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}} if id2label else {"num_labels": 1}),
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.cls_token_id,
        eos_token_id=fast.sep_token_id,
        cls_token_id=fast.cls_token_id,
        sep_token_id=fast.sep_token_id,
        initializer_range=0.2,
        norm_bias=seed % 2 == 1,
    )
    model = ModernBertForSequenceClassification(cfg)
    with torch.no_grad():  # see build_tiny_cross_encoder: logits within a few units
        for p in model.classifier.parameters():
            p.mul_(CLASSIFIER_SCALE)
    model.save_pretrained(out)
    return out


def build_tiny_cross_encoder(
    out_dir: str | Path,
    *,
    kind: str = "bert",
    num_labels: int = 1,
    id2label: dict[int, str] | None = None,
    seed: int = 0,
    config_extra: dict[str, Any] | None = None,
    fixed_vocab: bool = True,
) -> Path:
    """A ``BertForSequenceClassification`` (kind "bert"), ELECTRA ("electra") or XLM-R one ("xlmr") in ``out_dir``.

    ``fixed_vocab`` (bert, electra; the default): a vocabulary that is the same in every process
    (``_fixed_wordpiece_vocab``), so every test sees the same checkpoint in every process; ``False``
    trains WordPiece on the corpus instead, whose vocabulary differs per process (hash-order ties)."""
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = {"num_labels": num_labels}
    if id2label is not None:
        labels = {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}
    torch.manual_seed(seed)
    if kind == "bert":
        fast = _bert_tokenizer(out, fixed_vocab=fixed_vocab)
        cfg = BertConfig(
            vocab_size=len(fast),
            max_position_embeddings=512,
            type_vocab_size=2,
            pad_token_id=fast.pad_token_id,
            **_ENCODER,
            **labels,
        )
        model: Any = BertForSequenceClassification(cfg)
    elif kind == "electra":  # ms-marco-electra's layout: embeddings narrower than the layers (a projection)
        from transformers import ElectraConfig, ElectraForSequenceClassification

        fast = _bert_tokenizer(out, fixed_vocab=fixed_vocab)
        cfg = ElectraConfig(
            vocab_size=len(fast),
            embedding_size=64,
            max_position_embeddings=512,
            type_vocab_size=2,
            pad_token_id=fast.pad_token_id,
            **_ENCODER,
            **labels,
        )
        model = ElectraForSequenceClassification(cfg)
    elif kind == "xlmr":
        fast = _xlmr_tokenizer(out)
        cfg = XLMRobertaConfig(
            vocab_size=len(fast),
            max_position_embeddings=514,
            type_vocab_size=1,
            pad_token_id=fast.pad_token_id,
            bos_token_id=fast.bos_token_id,
            eos_token_id=fast.eos_token_id,
            **_ENCODER,
            **labels,
        )
        model = XLMRobertaForSequenceClassification(cfg)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    # Wide random init (0.2) makes the pairs' representations differ; a narrower classifier keeps
    # the logits within a few units so sigmoid does not saturate.
    with torch.no_grad():
        for p in model.classifier.parameters():
            p.mul_(CLASSIFIER_SCALE)
    model.save_pretrained(out)
    if config_extra:
        path = out / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config_extra}, indent=2))
    return out


def set_known_logit(model_dir: str | Path, logit: float) -> None:
    """Make every pair's logit exactly ``logit``: zero classifier weights, bias = ``logit``."""
    import torch
    from safetensors.torch import load_file, save_file

    path = Path(model_dir) / "model.safetensors"
    tensors = load_file(path)
    out_weight = [
        k for k in tensors if k.startswith("classifier.") and k.endswith(("out_proj.weight", "classifier.weight"))
    ]
    out_bias = [k for k in tensors if k.startswith("classifier.") and k.endswith(("out_proj.bias", "classifier.bias"))]
    assert len(out_weight) == 1 and len(out_bias) == 1, sorted(tensors)
    tensors[out_weight[0]] = torch.zeros_like(tensors[out_weight[0]])
    tensors[out_bias[0]] = torch.full_like(tensors[out_bias[0]], logit)
    save_file(tensors, path, metadata={"format": "pt"})


def build_tiny_bi_encoder(out_dir: str | Path, *, pooling: str = "mean", seed: int = 0, normalize: bool = True) -> Path:
    """A ``BertModel`` with sentence-transformers' modules.json and 1_Pooling/config.json."""
    import torch
    from transformers import BertConfig, BertModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast = _bert_tokenizer(out)
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(fast), max_position_embeddings=512, type_vocab_size=2, pad_token_id=fast.pad_token_id, **_ENCODER
    )
    BertModel(cfg).save_pretrained(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    # The older sentence-transformers layout: one boolean per mode.
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 128,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": pooling == "max",
                "pooling_mode_mean_sqrt_len_tokens": pooling == "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": pooling == "weightedmean",
                "pooling_mode_lasttoken": pooling == "lasttoken",
            }
        )
    )
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    return out


if __name__ == "__main__":
    base = Path(sys.argv[1])
    print(build_tiny_cross_encoder(base / "bert-ce"))
    print(build_tiny_cross_encoder(base / "xlmr-ce", kind="xlmr"))
    print(build_tiny_bi_encoder(base / "bert-bi"))
