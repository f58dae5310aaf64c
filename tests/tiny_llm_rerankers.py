"""Tiny random checkpoints of the LLM rerankers' real architectures, built offline in seconds.

- ``build_tiny_gemma``: ``GemmaForCausalLM`` (bge-reranker-v2-gemma's architecture) with a
  Gemma-shaped tokenizer: BPE over ``▁``-marked words, no pre-tokenizer, spaces turned into
  ``▁`` by the normalizer, ``<bos>`` added by the post-processor, as Gemma's tokenizer.json.
- ``build_tiny_qwen2``: ``Qwen2ForCausalLM`` (mxbai-rerank-v2's) with a Qwen2-shaped tokenizer:
  byte-level BPE behind Qwen2's own split regex, NFC normalizer, ``<|im_start|>``/``<|im_end|>``.

Random weights give meaningless relevance but exact, comparable numbers. The norms and biases
that random init leaves at zero (Gemma's ``1 + w`` RMSNorm, Qwen2's q/k/v biases) are filled
too, so a runtime that skipped one would score differently. Embeddings are tied, as in the
real checkpoints (gemma-2b, Qwen2.5-0.5B/1.5B).

Usable from the command line too: ``python -m tests.tiny_llm_rerankers gemma|qwen2 OUT_DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

_CORPUS = [
    (
        "Given a query A and a passage B, determine whether the passage contains an answer to the query "
        "by providing a prediction of either 'Yes' or 'No'."
    ),
    "Yes\nNo\nA: B: query: document: instruction: Relevance: 0 1",
    (
        "You are a search relevance expert who evaluates how well documents match search queries. For each "
        "query-document pair, carefully analyze the semantic relationship between them, then provide your "
        "binary relevance judgment (0 for not relevant, 1 for relevant)."
    ),
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant. system user assistant",
    "The capital of France is Paris. Berlin is the capital of Germany. Madrid is in Spain.",
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "What is the capital of the United States? How do I change my password? Click Settings.",
    "Quantum computing uses qubits. Text rerank models are widely used in search engines.",
    "The quick brown fox jumps over the lazy dog 0123456789 !?.,;:-_()[]{}'\"/\\@#$%^&*+=<>|~`",
]
# Qwen2's pre-tokenizer split (its tokenizer.json), before byte-level mapping without a regex.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _check_single(fast: Any, words: tuple[str, ...]) -> None:
    for word in words:
        ids = fast(word, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise RuntimeError(f"tiny tokenizer encodes {word!r} as {ids}; adjust the corpus")


def _fill_zero_inits(model: Any, seed: int) -> None:
    """Random values for the parameters random init leaves constant (norm weights, biases)."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(torch.randn(param.shape, generator=gen) * 0.2)
        # Random init gives score logits within a few hundredths; widen the (tied) head so
        # documents' scores differ by ~0.01-0.1 and orders are stable across runtimes.
        model.get_output_embeddings().weight.mul_(8.0)


def build_tiny_gemma(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 600) -> Path:
    """Write a Gemma-shaped tokenizer + random ``GemmaForCausalLM`` weights to ``out_dir``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import GemmaConfig, GemmaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Train SentencePiece-style: words start with "▁" and no merge crosses one...
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials)
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    # ... then serve like Gemma's tokenizer.json: spaces become "▁" in the normalizer, no
    # pre-tokenizer, no dummy prefix, "<bos>" prepended by the post-processor.
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse()])
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    _check_single(fast, ("Yes",))
    fast.save_pretrained(out)

    cfg = GemmaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention needs >= 64
        max_position_embeddings=8192,  # as gemma-2b
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(seed)
    model = GemmaForCausalLM(cfg)
    _fill_zero_inits(model, seed)
    model.save_pretrained(out)
    return out


def build_tiny_qwen2(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 600) -> Path:
    """Write a Qwen2-shaped tokenizer + random ``Qwen2ForCausalLM`` weights to ``out_dir``."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=specials[1:]
    )
    _check_single(fast, ("0", "1"))
    fast.save_pretrained(out)

    cfg = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,  # head_dim 64: vLLM's CPU attention needs >= 64
        max_position_embeddings=32768,  # as Qwen2.5-0.5B
        tie_word_embeddings=True,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    _fill_zero_inits(model, seed)
    model.save_pretrained(out)
    return out


if __name__ == "__main__":
    build = {"gemma": build_tiny_gemma, "qwen2": build_tiny_qwen2}[sys.argv[1]]
    print(f"wrote a tiny random {sys.argv[1]} checkpoint to {build(sys.argv[2])} (scores are meaningless)")
