"""Tiny checkpoints written by the installed sentence-transformers itself (6.x layout).

The weights and tokenizer are ``tests.tiny_encoders``' random BERT; the sentence-transformers
files (``modules.json``, ``1_Pooling/config.json``, ``config_sentence_transformers.json``, the
cross-encoder's config) are whatever ``SentenceTransformer.save`` / ``CrossEncoder.save`` of the
installed release write, so the gateway is tested on the layout users really get.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.tiny_encoders import build_tiny_bi_encoder, build_tiny_cross_encoder


def bare_bert(out_dir: str | Path, *, seed: int = 0) -> Path:
    """A random ``BertModel`` and its tokenizer, without any sentence-transformers file."""
    out = build_tiny_bi_encoder(out_dir, seed=seed, normalize=False)
    for name in ("modules.json", "sentence_bert_config.json"):
        (out / name).unlink()
    shutil.rmtree(out / "1_Pooling")
    return out


def save_st_bi_encoder(
    base: str | Path,
    out_dir: str | Path,
    *,
    pooling: str | tuple[str, ...],
    normalize: bool = True,
    dense: bool = False,
    similarity: str | None = None,
) -> Any:
    """Wrap the BERT in ``base`` in sentence-transformers modules and ``save()`` it; returns the model."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    transformer = Transformer(str(base))
    modules: list[Any] = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)]
    if dense:
        torch.manual_seed(1)
        modules.append(Dense(modules[-1].get_embedding_dimension(), 16))
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", similarity_fn_name=similarity)
    model.save(str(out_dir))
    return model


def save_st_cross_encoder(
    out_dir: str | Path, *, seed: int = 0, id2label: dict[int, str] | None = None, activation: Any = None
) -> Any:
    """A random BERT sequence classifier loaded and ``save()``-d by ``CrossEncoder`` (with
    ``activation``, a torch module, declared); returns the library's model read back from the files."""
    from sentence_transformers import CrossEncoder

    src = build_tiny_cross_encoder(Path(str(out_dir) + "-src"), seed=seed, id2label=id2label)
    model = CrossEncoder(str(src), device="cpu", activation_fn=activation)
    model.save(str(out_dir))
    return CrossEncoder(str(out_dir), device="cpu")
