"""Build a tiny random XLM-R cross-encoder and write it as GGUF, offline, in seconds.

XLM-R is the architecture of the GGUF rerankers people run on llama.cpp (bge-reranker-v2-m3,
bge-reranker-base/large): a BERT encoder, positions offset by ``pad_token_id + 1``, no token
types, a ``dense -> tanh -> out_proj`` classification head and a SentencePiece unigram
tokenizer. We build one with a trained unigram tokenizer, save it as a Hugging Face checkpoint
(the reference the GGUF is compared with), then write the GGUF with the ``gguf`` package the way
llama.cpp's ``convert_hf_to_gguf.py`` writes XLM-R classifiers (``conversion/bert.py``): the
converter ships only in llama-cpp-python's sdist, never in an installed wheel (the Qwen3 test
downloads it, ``tests/llama_convert.py``; this writer keeps the XLM-R tests offline); the tensor
names come from gguf's own name map.

``with_rerank_head=False`` writes what a community "embedding" conversion of the same model
looks like: no ``cls``/``cls.output`` tensors and CLS pooling; llama.cpp still accepts it with
rank pooling and returns meaningless near-zero scores, which the gguf runtime must refuse.

Usable from the command line too: ``python -m tests.tiny_gguf OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
POSITION_OFFSET = 2  # XLM-R: pad_token_id (1) + 1

_CORPUS = [
    "what is the capital of the united states",
    "carson city is the capital city of the american state of nevada",
    "washington is the capital of the united states and a federal district",
    "capital punishment has existed in the united states since before it was a country",
    "the capital of france is paris and berlin is the capital of germany",
    "how do i change my password click settings then security",
    "quantum computing uses qubits and rerank models are used in search engines",
    "the quick brown fox jumps over the lazy dog",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9",
]


def build_tiny_xlmr(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 200) -> Path:
    """Write a tokenizer + random ``XLMRobertaForSequenceClassification`` (one logit) to ``out_dir``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaTokenizerFast

    from tests.tiny_encoders import fix_unigram_order

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, unk_token="<unk>", shrinking_factor=0.9
    )
    tok.train_from_iterator(_CORPUS * 10, trainer=trainer)
    fix_unigram_order(tok, SPECIALS)
    tok.add_special_tokens(["<mask>"])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    # XLM-R's pair layout, the one llama.cpp's default rerank prompt builds: <s> q </s></s> d </s>
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", bos), ("</s>", eos)],
    )
    fast = XLMRobertaTokenizerFast(tokenizer_object=tok, model_max_length=512)
    fast.save_pretrained(out)

    cfg = XLMRobertaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512 + POSITION_OFFSET,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        num_labels=1,
        # Wider than BERT's 0.02 so attention is not uniform and inputs really differ.
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    model = XLMRobertaForSequenceClassification(cfg)
    model.eval()
    # Calibrate the output layer on corpus pairs: logits centred on 0 with a spread of ~2, so
    # scores cover [0, 1] (not all ~0 or ~1) and orders are stable across runtimes and dtypes.
    with torch.no_grad():
        logits = torch.tensor(
            [float(model(**fast(q, d, return_tensors="pt")).logits[0, 0]) for q in _CORPUS[:3] for d in _CORPUS[3:]]
        )
        scale = 2.0 / float(logits.std())
        head = model.classifier.out_proj
        head.weight.mul_(scale)
        head.bias.copy_((head.bias - logits.mean()) * scale)
    model.save_pretrained(out)
    return out


def write_gguf(hf_dir: str | Path, out_file: str | Path, *, dtype: str = "f32", with_rerank_head: bool = True) -> Path:
    """Write the checkpoint in ``hf_dir`` (from :func:`build_tiny_xlmr`) as a GGUF file."""
    import gguf
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoConfig, XLMRobertaForSequenceClassification

    hf_dir, out_file = Path(hf_dir), Path(out_file)
    cfg = AutoConfig.from_pretrained(hf_dir)
    model = XLMRobertaForSequenceClassification.from_pretrained(hf_dir, dtype=torch.float32)
    arch = gguf.MODEL_ARCH.BERT
    w = gguf.GGUFWriter(str(out_file), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name("tiny-xlmr-reranker")
    w.add_context_length(cfg.max_position_embeddings - POSITION_OFFSET)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK if with_rerank_head else gguf.PoolingType.CLS)
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}[dtype]
    w.add_file_type(ftype)

    # Tokenizer: llama.cpp's "t5" model is SentencePiece unigram (what XLM-R GGUFs carry).
    tj = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    vocab = tj.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    scores = _unigram_scores(hf_dir)
    tokens, toktypes, token_scores = [], [], []
    for piece, idx in by_id:
        tokens.append(piece.encode("utf-8"))
        token_scores.append(0.0 if piece in SPECIALS + ["<mask>"] else scores[piece])
        if piece == "<unk>":
            toktypes.append(gguf.TokenType.UNKNOWN)
        elif piece in SPECIALS or piece == "<mask>":
            toktypes.append(gguf.TokenType.CONTROL)
        else:
            toktypes.append(gguf.TokenType.NORMAL)
        assert idx == len(tokens) - 1
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(token_scores)
    w.add_token_types(toktypes)
    w.add_add_space_prefix(True)
    w.add_remove_extra_whitespaces(True)
    w.add_token_type_count(cfg.type_vocab_size)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    w.add_sep_token_id(vocab["</s>"])
    w.add_unk_token_id(vocab["<unk>"])
    w.add_pad_token_id(vocab["<pad>"])
    w.add_mask_token_id(vocab["<mask>"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(True)

    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        name = hf_name.removeprefix("roberta.")
        if name in ("embeddings.position_ids", "embeddings.token_type_ids") or name.startswith("pooler."):
            continue
        if name.startswith("classifier.") and not with_rerank_head:
            continue
        base, _, suffix = name.rpartition(".")
        mapped = names.get_name(base)
        if mapped is None:
            raise KeyError(f"no GGUF name for {hf_name}")
        data = tensor.detach().float().numpy()
        if name == "embeddings.position_embeddings.weight":
            data = data[POSITION_OFFSET:]  # llama.cpp counts positions from 0
        # 1-D tensors stay F32, and so do the position and token-type tables, as llama.cpp's
        # converter keeps them (conversion/base.py): its BERT graph adds the token-type row to the
        # F32 embeddings with ggml_add, which ggml's CPU backend cannot do with an F16 operand
        # (binary-ops.cpp aborts the process: "unsupported types: dst: f32, src0: f32, src1: f16").
        if dtype == "f16" and data.ndim == 2 and mapped not in ("token_types", "position_embd"):
            data = data.astype(np.float16)
        w.add_tensor(f"{mapped}.{suffix}", np.ascontiguousarray(data))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_file


def _unigram_scores(hf_dir: Path) -> dict[str, float]:
    model = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    return {piece: float(score) for piece, score in model["vocab"]}


if __name__ == "__main__":
    hf = build_tiny_xlmr(Path(sys.argv[1]) / "hf")
    print(write_gguf(hf, Path(sys.argv[1]) / "tiny-reranker-f32.gguf"))
