"""Build a tiny random Qwen3 checkpoint with a real (trained) tokenizer, offline, in seconds.

Random weights give meaningless relevance but exact, comparable numbers: what parity tests
between engines need (same weights, same prompt, same score). The engines load it with their
real loading code, exactly as they would load ``Qwen/Qwen3-Reranker-0.6B`` from a directory.

Usable from the command line too: ``python -m tests.tiny_qwen3 OUT_DIR``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

_CORPUS = [
    'Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be "yes" or "no".',
    "Given a web search query, retrieve relevant passages that answer the query",
    "<Instruct>: <Query>: <Document>: system user assistant yes no",
    "The capital of France is Paris. Berlin is the capital of Germany. Madrid is in Spain.",
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "What is the capital of the United States? How do I change my password? Click Settings.",
    "Quantum computing uses qubits. Text rerank models are widely used in search engines.",
    "The quick brown fox jumps over the lazy dog 0123456789 !?.,;:-_()[]{}'\"/\\@#$%^&*+=<>|~`",
]


def build_tiny_qwen3(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 512, layers: int = 2) -> Path:
    """Write tokenizer + random Qwen3ForCausalLM weights to ``out_dir`` and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    # GPT-2's byte-level pre-tokenizer splits where Qwen2's does at the prompt's cut points.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # it printed blank lines on stdout even with nothing to show
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    for word in ("yes", "no"):
        ids = fast(word, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise RuntimeError(f"tiny tokenizer encodes {word!r} as {ids}; adjust the corpus")
    fast.save_pretrained(out)

    cfg = Qwen3Config(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,  # more for the pipeline split's stages (tests/test_packed_split.py)
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention needs >= 64
        max_position_embeddings=40960,  # as Qwen3-Reranker-0.6B: the default max_length (8192) fits
        tie_word_embeddings=False,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    # Random init gives yes/no logits within a few hundredths; widen the head so documents'
    # scores differ by ~0.01-0.1 and orders are stable across engines.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    from transformers.utils import logging as hf_logging

    # transformers draws a "Writing model shards" bar on stderr for a 2 MB file; keep the CLI quiet.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    _readable(out)
    return out


def _readable(out: Path) -> None:
    """Give every written file the mode a plain ``open(..., "w")`` gets (0644 under umask 022).

    safetensors' writer creates ``model.safetensors`` with mode 0600 whatever the umask, so a
    checkpoint built by one user could not be read by a server running as another.
    """
    mode = 0o666 & ~_umask()
    for path in out.iterdir():
        if path.is_file():
            path.chmod(mode)


def _umask() -> int:
    # Reading the umask without setting it: /proc on Linux; elsewhere set it and put it back.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


if __name__ == "__main__":
    print(
        f"wrote a tiny random Qwen3 checkpoint to {build_tiny_qwen3(sys.argv[1])} (scores are meaningless: for trying the gateway)"
    )
