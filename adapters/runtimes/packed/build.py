"""Which packed engine serves a model: the one function ``adapters.registry`` calls for ``engine = "packed"``.

Apart from both engines (``engine.PackedQwen3Engine``, ``encoder.PackedEncoderEngine``) so that
neither imports the other: the encoder engine builds on ``engine.PackedEngineBase``.
"""

from __future__ import annotations

from typing import Any

from adapters.runtimes.packed.encoder import PackedEncoderEngine
from adapters.runtimes.packed.engine import PackedQwen3Engine
from schemas.config import PackedEngineConfig

__all__ = ("build_packed_engine",)


def build_packed_engine(config: PackedEngineConfig) -> Any:
    """The packed engine for ``config``'s family (``auto``: read from the checkpoint's JSON files).

    Called in a worker thread by ``adapters.registry.build_engine``. A checkpoint whose family
    cannot be read here gets the Qwen3 engine, whose start reports why (the same error).
    """
    family = config.family
    if family == "auto":
        from adapters.families.detect import resolve_family

        try:
            family = resolve_family(config.family, config.path, config.revision)[0].family
        except Exception:  # noqa: BLE001  # unreadable or undetectable: the start names the cause
            family = "qwen3"
    if family == "cross-encoder":
        return PackedEncoderEngine(config)
    return PackedQwen3Engine(config)
