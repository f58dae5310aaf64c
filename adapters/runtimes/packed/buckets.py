"""How a packed cross-encoder step is padded to a CUDA graph's bucket (:mod:`.graphs`).

A graph has fixed shapes, so a step is padded to a bucket (``graphs.StepGraphs.key``): its tokens to
16 short of a multiple of a power of two near 1/16 of them (<= 1/16 padding above 4k tokens, 0.7-0.9 % of
the tokens replayed on the H200; always at least one padding token), its pairs to a power of
two above their count (at least one empty pair), its longest pair to a power of two (the varlen
kernel's ``max_seqlen``). The padding is inert:
padding tokens lie after the last cumulative length, so no pair attends them; the varlen kernel
leaves their attention rows unwritten (whatever the pool held there) and every other op is per
row, except that FlashAttention-3 reads a pair's keys and values in whole tiles past its end and
weighs the extra rows by exact zeros -- 0 * NaN is NaN, so the forward sets the padding rows to 0
after every layer (``pair_replica.real_rows``). The extra pairs are empty (their cumulative
length repeats the total) and point their first-token row at the first padding token; their
logits are dropped. ``PackedPairReplica._pack`` writes that layout; ``tests/test_packed_graphs.py``
checks it on CPU against the unpadded step with a varlen reference that fills untouched rows
with NaN and reads whole tiles as FA3 does.

Pure arithmetic on counts (no torch), so the engine can size its buckets before any graph exists.
"""

from __future__ import annotations

__all__ = ("Key", "bucket_key", "pow2_bucket", "token_bucket")

Key = tuple[int, int, int]  # (tokens, pairs, max length) after bucketing

# A bucket's token count is 16 short of a multiple of its step, so never a multiple of 64. On the
# H200 (report gpu-h200-2026-12-02-b, ``gemm_sweep_ms``) an XLM-R large layer's GEMMs took ~3 %
# longer at a token count M that is a multiple of 64 than at M +- 16 (up to 6 % around 14.8k
# tokens): cuBLAS picks another kernel there. That was the "padding costs more than its share"
# of report gpu-h200-2026-12-02: a 59,254-token step took 68.8 ms, padded to 59,392 72.3 ms.
_BUCKET_OFFSET = 16


def token_bucket(tokens: int) -> int:
    """``tokens`` rounded up to 16 short of a multiple of the largest power of two <= tokens / 16 (at
    least 256): at most 1/16 padding past 4k tokens, ~3 % on average, and 16 buckets per doubling."""
    step = max(256, 1 << max(0, (tokens // 16).bit_length() - 1))
    return -(-(tokens + _BUCKET_OFFSET) // step) * step - _BUCKET_OFFSET


def pow2_bucket(x: int, floor: int) -> int:
    """The smallest power of two >= ``x``, at least ``floor``."""
    return max(floor, 1 << max(0, x - 1).bit_length())


def bucket_key(tokens: int, pairs: int, max_len: int) -> Key:
    """The bucket of a step: at least one padding token and one empty pair (see the module docstring)."""
    return token_bucket(tokens + 1), pow2_bucket(pairs + 1, 16), pow2_bucket(max_len, 64)
