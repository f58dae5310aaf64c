"""Which packed replica runs an encoder checkpoint: :func:`make_replica`, by its model_type.

Apart from both replica modules (``encoder_forward``: BERT-style; ``modernbert_forward``) so that
neither imports the other: both build on ``pair_replica.PackedPairReplica``.
"""

from __future__ import annotations

from typing import Any

import torch

from adapters.runtimes.packed.encoder_forward import PackedEncoderReplica
from adapters.runtimes.packed.modernbert_forward import PackedModernBertReplica
from adapters.runtimes.packed.pair_replica import PackedPairReplica

__all__ = ("make_replica",)


def make_replica(
    model: Any, device: torch.device, *, attention: str, compile: bool, kernel: str = "auto", gelu_epilogue: str = "off"
) -> PackedPairReplica:
    """The replica class for the checkpoint's model_type (``schemas.config.PACKED_ENCODER_TYPES``).
    ``gelu_epilogue``: the config's (``auto`` / ``on`` / ``off``); ModernBERT's gated MLP has none."""
    if str(model.config.model_type) == "modernbert":
        if gelu_epilogue == "on":
            raise ValueError(
                "gelu_epilogue = 'on': ModernBERT's MLP is gated (GeGLU): its activation is not the "
                "up-projection's epilogue; use 'auto' or 'off'"
            )
        return PackedModernBertReplica(model, device, attention=attention, compile=compile, kernel=kernel)
    return PackedEncoderReplica(
        model, device, attention=attention, compile=compile, kernel=kernel, gelu_epilogue=gelu_epilogue
    )
