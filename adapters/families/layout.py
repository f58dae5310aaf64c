"""Special-token layout and windows of encoder checkpoints, read from the tokenizer and config.

Never hard-coded: BERT wraps a pair as ``[CLS] q [SEP] d [SEP]`` with token types 0/1, XLM-R as
``<s> q </s></s> d </s>`` with no token types, and other tokenizers differently. The tokenizer's
own post-processor (what ``tokenizer(q, d)`` applies) is asked once, on a sample pair, where
its special tokens go; the gateway then builds ``prefix + query + middle`` (shared) and
``document + tail`` (item + suffix) in token space, equal to what the tokenizer gives the pair.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from adapters.families.detect import ModelFiles

__all__ = (
    "SpecialLayout",
    "checkpoint_window",
    "load_encoder_tokenizer",
    "load_fast_tokenizer",
    "prepare_rust_tokenizers",
    "special_layout",
)

# Huge "model_max_length" values mean "not set" in Hugging Face tokenizer configs.
_UNSET_LENGTH = 1_000_000
# Encoders whose positions start at the config's pad_token_id + 1 (transformers'
# create_position_ids_from_input_ids); MPNet's too, from a padding index fixed at 1.
_PAD_NUMBERED = frozenset(
    {
        "roberta",
        "xlm-roberta",
        "camembert",
        "xlm-roberta-xl",
        "roberta-prelayernorm",
        "data2vec-text",
        "ibert",
        "xmod",
        "longformer",
        "luke",
    }
)


@dataclass(frozen=True)
class SpecialLayout:
    prefix: list[int]  # before the first sequence
    middle: list[int]  # between the sequences (pairs only)
    tail: list[int]  # after the last sequence
    # Token type ids: 1 from the second sequence on (BERT); False when every type is 0 (XLM-R).
    second_segment_typed: bool

    @property
    def specials(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.tail)


def special_layout(rust: Any, *, pair: bool) -> SpecialLayout:
    """Where ``rust`` (a ``tokenizers.Tokenizer``) puts special tokens around one or two sequences."""
    enc = rust.encode("a", "b", add_special_tokens=True) if pair else rust.encode("a", add_special_tokens=True)
    seq = enc.sequence_ids
    ids, types = enc.ids, enc.type_ids
    firsts = [i for i, s in enumerate(seq) if s == 0]
    seconds = [i for i, s in enumerate(seq) if s == 1]
    if not firsts or (pair and not seconds):
        raise ValueError("the tokenizer's post-processor drops a sequence; cannot build pairs")
    prefix = ids[: firsts[0]]
    if pair:
        middle = ids[firsts[-1] + 1 : seconds[0]]
        tail = ids[seconds[-1] + 1 :]
        # Types must switch from 0 to 1 exactly where the second sequence starts (or never):
        # that is all BERT-style models and vLLM's compressed token types can express.
        expected_one = [types[i] for i in range(seconds[0], len(ids))]
        expected_zero = [types[i] for i in range(seconds[0])]
        typed = any(expected_one)
        if any(expected_zero) or (typed and not all(expected_one)):
            raise ValueError(f"unsupported token type layout {types} for a pair")
    else:
        middle, tail, typed = [], ids[firsts[-1] + 1 :], False
    return SpecialLayout(prefix=list(prefix), middle=list(middle), tail=list(tail), second_segment_typed=typed)


def checkpoint_window(files: ModelFiles, tokenizer: Any) -> int:
    """Most tokens one sequence may hold for this checkpoint (before the config's max_length)."""
    cfg = files.config
    limits = []
    positions = cfg.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        # RoBERTa/XLM-R number positions from padding_idx + 1: 514 embeddings hold 512 tokens.
        kind = cfg.get("model_type")
        offset = (cfg.get("pad_token_id") or 0) + 1 if kind in _PAD_NUMBERED else 2 if kind == "mpnet" else 0
        limits.append(positions - offset)
    model_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(model_max, int) and 0 < model_max < _UNSET_LENGTH:
        limits.append(model_max)
    st_max = files.sentence_config.get("max_seq_length")
    if isinstance(st_max, int) and st_max > 0:
        limits.append(st_max)
    return min(limits) if limits else _UNSET_LENGTH


def prepare_rust_tokenizers() -> None:
    """Before a fast tokenizer loads: batch encoding in parallel, releasing the GIL (unless the
    environment already says otherwise).

    The pool's size is left to rayon (one thread per CPU; ``RAYON_NUM_THREADS`` sets it). Capping
    it at 8 on the 16-CPU H200 host cut the idle tail in one side-by-side call and was followed by
    the worst idle run measured in the next, on another machine, without a control beside it
    (report gpu-h200-2026-12-03, calls 7 and 8): not a default until it repeats.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def load_fast_tokenizer(path: str, revision: str | None, *, trust_remote_code: bool = False) -> Any:
    """The checkpoint's fast (Rust) tokenizer: batch encode runs in parallel, releasing the GIL."""
    prepare_rust_tokenizers()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    if getattr(tok, "backend_tokenizer", None) is None:
        raise ValueError(f"{path}: no fast tokenizer (tokenizer.json) found")
    rust = tok.backend_tokenizer
    # The HF wrapper resets truncation and padding before each of its own calls; we call the
    # Rust tokenizer directly, so a tokenizer.json that ships either must not cut or pad pieces.
    rust.no_truncation()
    rust.no_padding()
    return tok


def load_encoder_tokenizer(config: Any, files: ModelFiles) -> tuple[Any, int, int | None]:
    """An encoder family's fast tokenizer, its window (``max_length`` capped at the checkpoint's)
    and its pad id (None when the tokenizer names none)."""
    tok = load_fast_tokenizer(config.path, config.revision, trust_remote_code=config.trust_remote_code)
    return tok, min(config.max_length, checkpoint_window(files, tok)), tok.pad_token_id
