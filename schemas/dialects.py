"""Wire formats of the other servers' rerank dialects: Hugging Face TEI and vLLM's score API.

Clients written for those servers switch to the gateway by changing only the URL, so these
structs copy their field names, defaults and response shapes (TEI ``router/src/http/types.rs``
and ``router/src/lib.rs``; vLLM ``entrypoints/pooling/scoring/protocol.py``). Every dialect is
translated into the same service call as the Cohere routes (``gateway.http.dialects``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas.rerank import RequestModelName

__all__ = (
    "TeiClassifierModel",
    "TeiError",
    "TeiInfo",
    "TeiModelType",
    "TeiRank",
    "TeiRerankRequest",
    "VllmErrorBody",
    "VllmErrorInfo",
    "VllmScoreData",
    "VllmScoreRequest",
    "VllmScoreResponse",
    "VllmUsage",
)

# Checked by the service with its own messages; stated in the JSON schema only (as in
# schemas.rerank), so OpenAPI describes them without changing the decoder's errors.
NonBlank = msgspec.Meta(extra_json_schema={"minLength": 1, "pattern": r"\S"})
NonEmpty = msgspec.Meta(extra_json_schema={"minItems": 1})

# -- TEI -----------------------------------------------------------------------------------


class TeiRerankRequest(msgspec.Struct, kw_only=True, frozen=True):
    """TEI's ``POST /rerank`` body: ``texts`` instead of ``documents``, no ``model``."""

    query: Annotated[str, NonBlank, msgspec.Meta(description="The search query; not empty or only whitespace.")]
    texts: Annotated[
        list[str],
        NonEmpty,
        msgspec.Meta(description="Texts to rank against the query (strings only); empty is TEI's 400 `Empty`."),
    ]
    truncate: Annotated[
        bool | None,
        msgspec.Meta(
            description=(
                "true: cut a text that does not fit the model's window (see truncation_direction); "
                "false: such a text is an error (413); null/absent: the gateway's default, which "
                "splits it into chunks and keeps the best chunk's score."
            )
        ),
    ] = None
    # TEI's serde spelling is "Left"/"Right"; its OpenAPI shows lower case, so both are accepted.
    truncation_direction: Annotated[
        Literal["Left", "Right", "left", "right"],
        msgspec.Meta(description="Which end of a text `truncate: true` keeps the room on: Right cuts the end."),
    ] = "Right"
    raw_scores: Annotated[
        bool,
        msgspec.Meta(description="Return the model's raw output (a logit) instead of a score in [0, 1]."),
    ] = False
    return_text: Annotated[bool, msgspec.Meta(description="Echo each text in its result.")] = False


class TeiRank(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One element of TEI's response, a bare JSON array sorted by descending score."""

    index: int
    score: float
    text: str | None = None


TeiErrorType = Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


class TeiError(msgspec.Struct, kw_only=True, frozen=True):
    """TEI's error body. ``error_type`` is one of TEI's ``ErrorType`` names."""

    error: str
    error_type: TeiErrorType


class TeiClassifierModel(msgspec.Struct, kw_only=True, frozen=True):
    id2label: dict[str, str]
    label2id: dict[str, int]


class TeiModelType(msgspec.Struct, kw_only=True, frozen=True):
    reranker: TeiClassifierModel


class TeiInfo(msgspec.Struct, kw_only=True, frozen=True):
    """TEI's ``GET /info`` for the model that serves the TEI dialect."""

    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: TeiModelType
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None = None
    docker_label: str | None = None


# -- vLLM score API --------------------------------------------------------------------------

QuerySide = Annotated[
    Annotated[str, NonBlank] | Annotated[list[Annotated[str, NonBlank]], NonEmpty],
    msgspec.Meta(description="The query, or one query per pair (not empty or only whitespace)."),
]
TextSide = Annotated[
    str | Annotated[list[str], NonEmpty],
    msgspec.Meta(description="One text, or a list of texts (multimodal content parts are not supported)."),
]


class VllmScoreRequest(msgspec.Struct, kw_only=True, frozen=True):
    """vLLM's ``POST /score`` body, every pairing it accepts in one struct.

    Exactly one pair of sides must be given: ``text_1``/``text_2`` (the classic names),
    ``queries``/``documents``, ``queries``/``items`` or ``data_1``/``data_2``. The first side
    is the query (one for 1:N, or one per pair for N:N), the second the texts scored against it.
    """

    model: Annotated[
        RequestModelName | None, msgspec.Meta(description="Public model name (default: the first model).")
    ] = None
    text_1: QuerySide | None = None
    text_2: TextSide | None = None
    queries: QuerySide | None = None
    documents: TextSide | None = None
    items: TextSide | None = None
    data_1: QuerySide | None = None
    data_2: TextSide | None = None
    max_tokens_per_doc: Annotated[
        int, msgspec.Meta(ge=0, description="Truncate each text of the second side to this many tokens; 0: none.")
    ] = 0
    instruction: Annotated[str | None, msgspec.Meta(description="Task instruction (Qwen3).")] = None
    instruct: Annotated[str | None, msgspec.Meta(description="Alias of `instruction` (as on /rerank).")] = None
    chat_template_kwargs: Annotated[
        dict[str, Any] | None,
        msgspec.Meta(
            description=(
                "vLLM's template variables: its `instruction` (or `instruct`) is the task instruction "
                "when the request gives none; other keys are ignored."
            )
        ),
    ] = None
    use_activation: Annotated[
        bool | None,
        msgspec.Meta(description="false returns the model's raw output (a logit) instead of a score in [0, 1]."),
    ] = None


class VllmScoreData(msgspec.Struct, kw_only=True, frozen=True):
    index: int
    score: float
    object: str = "score"


class VllmUsage(msgspec.Struct, kw_only=True, frozen=True):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: dict[str, Any] | None = None


class VllmScoreResponse(msgspec.Struct, kw_only=True, frozen=True):
    """vLLM's score response: one score per pair, in the order of the pairs (not sorted)."""

    id: str
    created: int
    model: str
    data: list[VllmScoreData]
    usage: VllmUsage
    object: str = "list"


class VllmErrorInfo(msgspec.Struct, kw_only=True, frozen=True):
    message: str
    type: str
    code: int
    param: str | None = None


class VllmErrorBody(msgspec.Struct, kw_only=True, frozen=True):
    """vLLM's error body (``entrypoints/serve/engine/protocol.py::ErrorResponse``)."""

    error: VllmErrorInfo
