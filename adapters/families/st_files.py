"""sentence-transformers' own files: which modules a saved embedding model runs, and how it pools.

Two layouts exist and both are read as sentence-transformers itself reads them:

- older releases name modules ``sentence_transformers.models.Pooling`` (``.Transformer``,
  ``.Normalize``...) in ``modules.json`` and write ``1_Pooling/config.json`` as one boolean per
  mode (``pooling_mode_cls_token``, ``pooling_mode_mean_tokens``...);
- 6.x names the module's real path (``sentence_transformers.sentence_transformer.modules.pooling.Pooling``,
  ``sentence_transformers.base.modules.transformer.Transformer``...) and writes
  ``{"pooling_mode": "cls"}`` (a string, or a list of modes to concatenate).

A module is known by its class name (the last part of ``type``), so both spellings and any later
move of the class inside the package are read alike. Every pooling mode the library allows is
served; a module the gateway does not apply (Dense, LayerNorm, a Router...) or a similarity the
cosine cannot stand for is refused at start with a message naming it: a model that scores
differently from sentence-transformers must never be served silently. The query and document
prompts are the ones ``encode_query`` / ``encode_document`` use (``_prompts``).

Standard library only (and ``adapters.base``): ``check-config`` reads these without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from adapters.base import EngineConfigError

__all__ = (
    "POOLING_MODES",
    "BiEncoderPipeline",
    "SentenceTransformersLayoutError",
    "bi_encoder_pipeline",
    "cross_encoder_pipeline",
    "cross_encoder_prompt",
    "module_class",
    "pooling_modes",
    "pooling_module",
)

# sentence-transformers' modes, in the order it concatenates several (Pooling.POOLING_MODES).
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# The older boolean keys, in that same order (sentence-transformers' _LEGACY_POOLING_MODE_KWARGS).
_LEGACY_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# Modules after the pooling that leave the cosine unchanged: Normalize scales each embedding to
# length 1; Dropout does nothing at inference.
_NEUTRAL_AFTER_POOLING = frozenset({"Normalize", "Dropout"})
# Transformer tasks whose output is the token embeddings the pooling reads.
_EMBEDDING_TASKS = frozenset({"feature-extraction"})


class SentenceTransformersLayoutError(EngineConfigError):
    """The checkpoint's sentence-transformers pipeline does something the gateway would not."""


def module_class(module: dict[str, Any]) -> str | None:
    """The class name of a ``modules.json`` entry of sentence-transformers itself, else None.

    ``sentence_transformers.models.Pooling`` and
    ``sentence_transformers.sentence_transformer.modules.pooling.Pooling`` both give ``Pooling``;
    a remote-code module (``custom_st.MyModule``) gives None.
    """
    kind = module.get("type")
    if not isinstance(kind, str) or not kind.startswith("sentence_transformers."):
        return None
    return kind.rsplit(".", 1)[-1]


def pooling_module(modules: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The first Pooling entry of ``modules.json`` (either layout), or None."""
    return next((m for m in modules if module_class(m) == "Pooling"), None)


def pooling_modes(config: dict[str, Any]) -> tuple[str, ...]:
    """The modes ``1_Pooling/config.json`` asks for, in concatenation order.

    ``pooling_mode`` (6.x: a string or a list) wins over the older booleans, as in
    sentence-transformers; no boolean set means mean, its default. An unknown mode raises.
    """
    if "pooling_mode" in config:
        raw = config["pooling_mode"]
        modes = (raw,) if isinstance(raw, str) else tuple(raw) if isinstance(raw, list | tuple) else ()
        if not modes:
            raise SentenceTransformersLayoutError(
                f"1_Pooling/config.json: pooling_mode {raw!r} is not a mode or a list of modes"
            )
    else:
        modes = tuple(mode for key, mode in _LEGACY_FLAGS.items() if config.get(key)) or ("mean",)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise SentenceTransformersLayoutError(
            f"1_Pooling/config.json: pooling mode {unknown[0]!r} is not one the gateway knows "
            f"({', '.join(POOLING_MODES)}); set the model's pooling to one of them"
        )
    return modes


@dataclass(frozen=True)
class BiEncoderPipeline:
    """What the gateway runs for a bi-encoder: pooling, normalisation, input casing."""

    pooling: tuple[str, ...]  # concatenated in this order
    normalize: bool  # a Normalize module follows the pooling
    lowercase: bool  # sentence_bert_config.json's do_lower_case: texts are lowercased first
    similarity: str  # config_sentence_transformers.json's similarity_fn_name (cosine when absent)
    # The text put before the query / each document, as encode_query / encode_document put it.
    query_prompt: str = ""
    document_prompt: str = ""

    @property
    def description(self) -> str:
        parts = ["+".join(self.pooling) + " pooling"]
        if self.normalize:
            parts.append("Normalize")
        if self.lowercase:
            parts.append("lowercased input")
        if self.similarity != "cosine":
            parts.append(f"{self.similarity} similarity")
        if self.query_prompt or self.document_prompt:
            parts.append(f"prompts: query {self.query_prompt!r}, document {self.document_prompt!r}")
        return ", ".join(parts)


def bi_encoder_pipeline(
    modules: Sequence[dict[str, Any]],
    pooling_config: dict[str, Any],
    sentence_config: dict[str, Any],
    model_config: dict[str, Any],
    *,
    configured_pooling: str = "auto",
) -> BiEncoderPipeline:
    """Read (and check) the pipeline of a sentence-transformers embedding model.

    Without ``modules.json`` (a bare encoder named bi-encoder in the config) the pipeline is the
    configured pooling (mean for ``auto``) and a cosine. Raises
    :class:`SentenceTransformersLayoutError` for anything the gateway would compute differently.
    """
    if configured_pooling != "auto":
        configured: tuple[str, ...] | None = (configured_pooling,)
    else:
        configured = None
    similarity = model_config.get("similarity_fn_name") or "cosine"
    lowercase = bool(sentence_config.get("do_lower_case"))
    if not modules:
        return BiEncoderPipeline(configured or ("mean",), False, lowercase, similarity)

    names = [module_class(m) or str(m.get("type")) for m in modules]
    where = [f"{m.get('path') or '(root)'} ({m.get('type')})" for m in modules]
    if names[0] != "Transformer":
        raise SentenceTransformersLayoutError(
            f"modules.json starts with {where[0]}, not a Transformer module; only "
            "Transformer -> Pooling [-> Normalize] pipelines are served"
        )
    if modules[0].get("path") not in ("", None):
        raise SentenceTransformersLayoutError(
            f"modules.json: the Transformer module lives in {modules[0]['path']!r}, not the checkpoint's root; "
            "point the model's path at that folder"
        )
    task = sentence_config.get("transformer_task")
    if task is not None and task not in _EMBEDDING_TASKS:
        raise SentenceTransformersLayoutError(
            f"sentence_bert_config.json: transformer_task {task!r} is not an embedding model's (feature-extraction)"
        )
    # 6.x: which output of the model the pooling reads; the gateway pools the last hidden state.
    text = (sentence_config.get("modality_config") or {}).get("text") or {}
    read = (text.get("method", "forward"), text.get("method_output_name", "last_hidden_state"))
    if read != ("forward", "last_hidden_state"):
        raise SentenceTransformersLayoutError(
            f"sentence_bert_config.json: the text embeddings come from {read[0]}().{read[1]}, "
            "not forward().last_hidden_state, which the gateway pools"
        )
    if "Pooling" not in names:
        raise SentenceTransformersLayoutError(f"modules.json has no Pooling module ({', '.join(where)})")
    at = names.index("Pooling")
    if at != 1:
        raise SentenceTransformersLayoutError(
            f"modules.json: {where[1]} runs between the Transformer and the Pooling; the gateway does not apply it"
        )
    for name, text in zip(names[2:], where[2:], strict=True):
        if name not in _NEUTRAL_AFTER_POOLING:
            raise SentenceTransformersLayoutError(
                f"modules.json: {text} runs after the pooling and the gateway does not apply it "
                "(served: Normalize, Dropout); this model would score differently from sentence-transformers"
            )
    pooling = configured or pooling_modes(pooling_config)
    normalize = "Normalize" in names[2:]
    if similarity not in ("cosine", "dot", "euclidean", "manhattan"):
        raise SentenceTransformersLayoutError(
            f"config_sentence_transformers.json: unknown similarity_fn_name {similarity!r}"
        )
    # The gateway ranks by cosine. Dot product and euclidean distance of unit-length embeddings
    # order documents exactly as the cosine does; otherwise (or manhattan) they do not.
    if similarity == "manhattan" or (similarity != "cosine" and not normalize):
        raise SentenceTransformersLayoutError(
            f"config_sentence_transformers.json: similarity_fn_name {similarity!r}"
            + ("" if similarity == "manhattan" else " without a Normalize module")
            + " ranks differently from the cosine the gateway scores with"
        )
    query_prompt, document_prompt = _prompts(model_config)
    if (query_prompt or document_prompt) and pooling_config.get("include_prompt", True) is False:
        raise SentenceTransformersLayoutError(
            "1_Pooling/config.json: include_prompt is false (the prompt's tokens left out of the pooling), "
            "which the gateway does not do; this model would score differently from sentence-transformers"
        )
    return BiEncoderPipeline(pooling, normalize, lowercase, similarity, query_prompt, document_prompt)


def _prompts(model_config: dict[str, Any]) -> tuple[str, str]:
    """(query prompt, document prompt) as the installed sentence-transformers' (6.2)
    ``encode_query`` / ``encode_document`` pick them.

    ``SentenceTransformer`` starts from ``{"query": "", "document": ""}`` and fills in the saved
    ``prompts``: the query gets ``prompts["query"]``, a document ``prompts["document"]``. Its
    fallbacks (``passage``, ``corpus``, then ``default_prompt_name``, which ``encode`` uses) are
    never reached, since both keys always exist.
    """
    prompts = {"query": "", "document": ""}
    prompts.update({str(k): v or "" for k, v in (model_config.get("prompts") or {}).items()})
    default_name = model_config.get("default_prompt_name")
    if default_name is not None and default_name not in prompts:
        raise SentenceTransformersLayoutError(
            f"config_sentence_transformers.json: default_prompt_name {default_name!r} is not in prompts"
        )
    return prompts["query"], prompts["document"]


def cross_encoder_pipeline(modules: Sequence[dict[str, Any]], sentence_config: dict[str, Any]) -> None:
    """Check a cross-encoder's ``modules.json`` (6.x's ``CrossEncoder.save`` writes one).

    Served: the classifier alone (one Transformer at the root, ``transformer_task``
    ``sequence-classification``), whose logits the family reads. Anything after it (a Dense
    scores head, a LogitScore over a causal LM's vocabulary) is refused, naming the module.
    """
    if not modules:
        return  # older layouts: config.json alone
    names = [module_class(m) or str(m.get("type")) for m in modules]
    where = [f"{m.get('path') or '(root)'} ({m.get('type')})" for m in modules]
    if names[0] != "Transformer" or modules[0].get("path") not in ("", None):
        raise SentenceTransformersLayoutError(
            f"modules.json starts with {where[0]}, not a Transformer at the checkpoint's root"
        )
    task = sentence_config.get("transformer_task")
    if task is not None and task != "sequence-classification":
        raise SentenceTransformersLayoutError(
            f"sentence_bert_config.json: transformer_task {task!r} is not a cross-encoder's (sequence-classification)"
        )
    if len(modules) > 1:
        raise SentenceTransformersLayoutError(
            f"modules.json: {where[1]} runs after the classifier and the gateway does not apply it; "
            "this model would score differently from sentence-transformers"
        )


def cross_encoder_prompt(st_config: dict[str, Any]) -> str:
    """The prompt 6.x's ``CrossEncoder.predict`` / ``rank`` put before the query by default.

    ``config_sentence_transformers.json``'s ``default_prompt_name`` names one of its ``prompts``;
    the library then prepends that prompt to the query text of every pair (none when unset).
    """
    name = st_config.get("default_prompt_name")
    if name is None:
        return ""
    prompts = st_config.get("prompts") or {}
    if name not in prompts:
        raise SentenceTransformersLayoutError(
            f"config_sentence_transformers.json: default_prompt_name {name!r} is not in prompts"
        )
    return prompts[name] or ""
