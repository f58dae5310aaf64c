"""The host side of one packed Qwen3 step: its layout in one int64 buffer, staged for one copy.

``pack`` lays a step's groups (shared prefix + tails, see ``forward``'s docstring) out in one
int64 host tensor -- token ids, positions, cu_q, [cu_k], rows scored, [k/v gather index] --
so the step reaches the device in a single copy; ``unpack`` splits that buffer (on the device)
into the forward's inputs and a ``Step``. ``HostStaging`` owns the pinned buffers the copies
come from (``pair_replica``'s steps are staged in it too). ``gather_kv`` builds each tail's
keys [P; T_i] from the step's gather index.

Imported only through ``forward`` and ``pair_replica`` (pulls in torch).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = ("Group", "HostStaging", "Step", "gather_kv", "pack", "unpack")

# (shared prefix, tails): the prompts prefix + tail for each tail, scored in order.
Group = tuple[Sequence[int], Sequence[Sequence[int]]]


class Step(NamedTuple):
    """One packed step's layout on the device (built by ``pack`` on the host, copied in one go)."""

    cu_q: torch.Tensor  # int32 (sequences + 1): query tokens per sequence (prefixes and tails)
    cu_k: torch.Tensor  # int32: key tokens per sequence (= cu_q without shared prefixes)
    max_q: int
    max_k: int  # also 1 + the step's largest position
    kv: torch.Tensor | None  # int64 rows of k/v making each sequence's keys ([P; T_i]); None: k/v as they are
    last: torch.Tensor  # int64 rows scored: the last token of each tail
    lens_q: list[int] | None  # host lengths, for the per-sequence SDPA only
    lens_k: list[int] | None


def gather_kv(k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k[rows], v[rows]``; when v follows k in each row of one buffer (vLLM's in-place q/k norm +
    RoPE leaves them as views of the q/k/v projection) one gather copies both: one kernel, whole rows."""
    n, heads, dim = k.shape
    width = heads * dim
    if (
        v.shape == k.shape
        and k.stride() == v.stride()
        and k.stride()[1:] == (dim, 1)
        and k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
        and v.data_ptr() == k.data_ptr() + width * k.element_size()
    ):
        kv = k.as_strided((n, 2 * width), (k.stride(0), 1)).index_select(0, rows)
        return kv[:, :width].view(-1, heads, dim), kv[:, width:].view(-1, heads, dim)
    return k.index_select(0, rows), v.index_select(0, rows)


class HostStaging:
    """Staging buffers for a step's one copy to the device: pinned on CUDA (async copy), reused
    once their last copy has finished."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stage = [torch.empty(0, dtype=torch.long)] * 2  # pinned host buffers, alternated between steps
        self._stage_done: list[Any] = [None, None]  # each one's last copy to the device
        self._slot = 0

    def buffer(self, n: int) -> torch.Tensor:
        """A host buffer of at least ``n`` int64s (a fresh unpinned one off CUDA)."""
        if self.device.type != "cuda":
            return torch.empty(n, dtype=torch.long)
        # Two buffers: the pipelined scheduler fills step k+1's while step k's copy may be in flight.
        self._slot ^= 1
        done = self._stage_done[self._slot]
        if done is not None:
            done.synchronize()
        if self._stage[self._slot].numel() < n:
            self._stage[self._slot] = torch.empty(max(n, 1 << 18), dtype=torch.long, pin_memory=True)
        return self._stage[self._slot]

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        """Queue the copy of the latest ``buffer`` (CUDA; the current device must be ours) and
        remember its end, before which that buffer is not handed out again."""
        d = host.to(self.device, non_blocking=True)
        self._copied()
        return d

    def copy_into(self, dst: torch.Tensor, host: torch.Tensor) -> None:
        """As ``to_device``, into ``dst`` (a CUDA graph's static inputs)."""
        dst[: host.numel()].copy_(host, non_blocking=True)
        self._copied()

    def _copied(self) -> None:
        ev = torch.cuda.Event()
        ev.record()
        self._stage_done[self._slot] = ev


def pack(groups: Sequence[Group], staging: HostStaging) -> tuple[torch.Tensor, dict[str, Any]]:
    """The step in one int64 host tensor (one copy to the device), in this order: token ids,
    positions, cu_q, [cu_k], rows scored, [k/v gather index] -- the bracketed parts only when a
    group has a prefix. Per-sequence lists in Python, per-token arrays in numpy (~10x faster
    than building tensors from lists)."""
    qlen: list[int] = []  # per sequence: query tokens,
    pos0: list[int] = []  # position of its first token,
    kpre: list[int] = []  # prefix keys before its own (0 for a prefix, len(P) for a tail),
    pstart: list[int] = []  # first row of those prefix keys
    last: list[int] = []
    t = 0
    for prefix, tails in groups:
        p, ps = len(prefix), t
        if p:
            qlen.append(p), pos0.append(0), kpre.append(0), pstart.append(ps)
            t += p
        for tail in tails:
            qlen.append(len(tail)), pos0.append(p), kpre.append(p), pstart.append(ps)
            t += len(tail)
            last.append(t - 1)
    n_seq, n_last = len(qlen), len(last)
    shared = any(kpre)
    lens = np.array(qlen, dtype=np.int64)
    qstart = np.cumsum(lens) - lens
    klen = lens + np.array(kpre, dtype=np.int64) if shared else lens
    n_kv = int(klen.sum()) if shared else 0
    size = 2 * t + (n_seq + 1) * (2 if shared else 1) + n_last + n_kv
    buf = staging.buffer(size)
    arr = buf.numpy()
    arr[:t] = np.fromiter(
        itertools.chain.from_iterable(itertools.chain(pre, *tails) for pre, tails in groups), dtype=np.int64, count=t
    )
    # positions: 0.. within a prefix, len(P).. within each of its tails
    arr[t : 2 * t] = np.arange(t) + np.repeat(np.array(pos0, dtype=np.int64) - qstart, lens)
    o = 2 * t
    arr[o] = 0
    np.cumsum(lens, out=arr[o + 1 : o + 1 + n_seq])
    o += n_seq + 1
    if shared:
        arr[o] = 0
        np.cumsum(klen, out=arr[o + 1 : o + 1 + n_seq])
        o += n_seq + 1
    arr[o : o + n_last] = last
    o += n_last
    if shared:
        # each sequence's keys: rows [pstart, pstart + kpre) then its own [qstart, qstart + qlen)
        seg_start = np.stack((np.array(pstart, dtype=np.int64), qstart), axis=1).ravel()
        seg_len = np.stack((np.array(kpre, dtype=np.int64), lens), axis=1).ravel()
        arr[o : o + n_kv] = np.arange(n_kv) + np.repeat(seg_start - (np.cumsum(seg_len) - seg_len), seg_len)
    meta = {
        "tokens": t,
        "sequences": n_seq,
        "scored": n_last,
        "kv": n_kv,
        "max_q": int(lens.max()),
        "max_k": int(klen.max()),
        "lens_q": qlen,
        "lens_k": klen.tolist() if shared else qlen,
    }
    return buf[:size], meta


def unpack(d: torch.Tensor, meta: dict[str, Any], per_seq: bool) -> tuple[torch.Tensor, torch.Tensor, Step]:
    """Split ``pack``'s buffer (on the device) into token ids, positions and the ``Step``;
    ``per_seq``: keep the host lengths (the per-sequence SDPA needs them)."""
    t, n_seq, n_last, n_kv = meta["tokens"], meta["sequences"], meta["scored"], meta["kv"]
    n_cu = (n_seq + 1) * (2 if n_kv else 1)
    cu = d[2 * t : 2 * t + n_cu].to(torch.int32)  # one conversion for cu_q and cu_k
    o = 2 * t + n_cu
    step = Step(
        cu_q=cu[: n_seq + 1],
        cu_k=cu[n_seq + 1 :] if n_kv else cu,
        max_q=meta["max_q"],
        max_k=meta["max_k"],
        kv=d[o + n_last : o + n_last + n_kv] if n_kv else None,
        last=d[o : o + n_last],
        lens_q=meta["lens_q"] if per_seq else None,
        lens_k=meta["lens_k"] if per_seq else None,
    )
    return d[:t], d[t : 2 * t], step
