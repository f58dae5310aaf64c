"""Typed configuration: frozen msgspec structs decoded from TOML plus ``RERANK_*`` overrides.

Every struct forbids unknown fields so a typo fails at start with the field's path. A model
entry is a tagged union on ``engine``: the engine kind is a type, never a free string that code
compares against. Loading (file, env, defaults) lives in ``gateway.config.settings``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

__all__ = (
    "ApiKeyConfig",
    "AuthConfig",
    "CacheConfig",
    "DEFAULT_INSTRUCTION",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_PATH",
    "DashScopeEngineConfig",
    "DialectsConfig",
    "EngineConfig",
    "FAMILY_RUNTIMES",
    "FamilyName",
    "GgufEngineConfig",
    "LLM_RERANKERS",
    "LimitsConfig",
    "LlmRerankerSpec",
    "LocalModelConfig",
    "LoggingConfig",
    "ModelConfig",
    "OpenVinoEngineConfig",
    "PackedEngineConfig",
    "PoolEngineConfig",
    "Qwen3LocalConfig",
    "RUNTIME_REFUSALS",
    "ServerConfig",
    "Settings",
    "StaticEngineConfig",
    "TransformersEngineConfig",
    "UpstreamHttpConfig",
    "VllmEngineConfig",
    "VllmGenerateEngineConfig",
    "VllmScoreEngineConfig",
    "runtime_refusal",
)

DEFAULT_MODEL_PATH = "Qwen/Qwen3-Reranker-0.6B"
DEFAULT_MODEL_NAME = "qwen3-reranker-0.6b"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
# `description` is also what a config error says the value must be (gateway.config.config_schema).
ModelName = Annotated[
    str,
    msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\s]+$",
                 description="a name without spaces, tabs or line breaks (e.g. qwen3-reranker-0.6b)"),
]


class _Strict(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    pass


class ServerConfig(_Strict):
    # Address to bind; anything but loopback needs API keys ([auth]) or auth.open = true.
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000  # TCP port to listen on
    # uvicorn is a hard dependency and the faster for a passthrough gateway (one client: granian
    # added 0.7-1.8 ms more, docs/benchmarks/cpu-2026-12-01-granian); granian is optional (extra `granian`).
    runner: Literal["uvicorn", "granian"] = "uvicorn"
    # Connection bounds (gateway.launch.servers): no client holds a descriptor forever.
    keep_alive_timeout_s: PositiveFloat = 5.0  # idle connection, fresh or between requests
    header_read_timeout_s: PositiveFloat = 10.0  # a request's headers, from their first byte
    body_read_timeout_s: PositiveFloat = 30.0  # the whole body, from the headers (then 408)
    # SIGTERM: stop accepting, give in-flight requests this long to finish, then stop engines.
    shutdown_timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # A model that failed to load is retried with capped exponential backoff: after
    # load_retry_initial_s, then twice as long each time, at most load_retry_max_s apart.
    load_retry_initial_s: PositiveFloat = 5.0
    load_retry_max_s: PositiveFloat = 300.0  # the longest wait between two load attempts
    # Liveness (/health) answers 503 once every model has been failed or unhealthy this long,
    # so an orchestrator restarts the process; 0 keeps /health 200 whatever the models do.
    liveness_failure_after_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    # Server processes sharing the port. Above 1, per-key limits are per worker unless
    # limits.redis_url is set, and /metrics sums every worker (prometheus multiprocess mode).
    workers: Positive = 1


class LoggingConfig(_Strict):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"  # the gateway's and libraries' log level
    # "json": one JSON object per line on stdout (third-party lines too); "console": for people.
    format: Literal["json", "console"] = "json"


class LimitsConfig(_Strict):
    max_body_bytes: Positive = 20 * 1024 * 1024  # larger request bodies get 413
    max_documents: Positive = 10_000  # documents per request; more get 413
    # Cohere caps documents x chunks at 10,000; we cap the chunks actually produced.
    max_total_chunks: Positive = 10_000
    # Per-key rate limits live in this Redis when set (shared by every replica), else in memory.
    redis_url: str | None = None
    # Redis unreachable: "closed" answers 503, "open" falls back to this process's own counters.
    redis_failure: Literal["open", "closed"] = "closed"
    redis_timeout_s: PositiveFloat = 0.5  # per Redis call; slower counts as Redis unreachable


KeyId = Annotated[
    str,
    msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                 description="1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"),
]
KeyHash = Annotated[
    str,
    msgspec.Meta(pattern=r"^sha256:[0-9a-f]{64}$",
                 description="'sha256:' and 64 lowercase hex digits, as `rerank-gateway keys hash` prints"),
]


class ApiKeyConfig(_Strict):
    """One API key, stored as the SHA-256 of the key (``rerank-gateway keys create``), never the key."""

    id: KeyId  # shown in logs, metrics and errors instead of the key
    hash: KeyHash  # "sha256:" and the key's SHA-256 in hex
    # Canonical model names or globs ("qwen3-*", "*"); aliases are resolved before matching.
    models: Annotated[tuple[ModelName, ...], msgspec.Meta(min_length=1)]
    expires_at: datetime | None = None  # without an offset: UTC
    rpm: Positive | None = None  # requests per minute (moving window)
    tpm: Positive | None = None  # engine-counted input tokens per minute
    max_concurrent: Positive | None = None  # requests in flight at once


class AuthConfig(_Strict):
    # Without keys the gateway only serves on loopback unless this is set.
    open: bool = False
    # API keys ([[auth.keys]] entries, from `rerank-gateway keys create`); none: the gateway is open.
    keys: tuple[ApiKeyConfig, ...] = ()


class CacheConfig(_Strict):
    """Response cache: exact repeats of a request answered without the engine (off by default)."""

    enabled: bool = False  # off by default: answers only exact repeats, x-cache says which
    # "memory": an LRU with TTL in this process; "redis": shared by every replica.
    backend: Literal["memory", "redis"] = "memory"
    ttl_s: PositiveFloat = 300.0  # how long a stored response is served
    max_entries: Positive = 10_000  # memory backend
    # Responses larger than this (encoded JSON) are not cached.
    max_entry_bytes: Positive = 1024 * 1024
    # Redis URL of the redis backend; None: limits.redis_url.
    redis_url: str | None = None
    # false: one key's cached answers are never served to another key.
    shared_across_keys: bool = False


class ModelConfig(_Strict, tag_field="engine"):
    """Fields every engine kind shares."""

    name: ModelName  # the public model name clients send (no spaces)
    # More names for the same model (e.g. "rerank-v3.5" for clients that send a fixed name).
    aliases: tuple[ModelName, ...] = ()
    timeout_s: PositiveFloat = 60.0  # engine (or upstream) time per request; then 504
    # Requests admitted to this model at once (running + waiting); more get 503 + Retry-After.
    max_concurrent_requests: Positive = 256


FamilyName = Literal[
    "auto", "qwen3", "bge-reranker-v2-gemma", "mxbai-rerank-v2", "cross-encoder", "bi-encoder", "jina-v3"
]


class LlmRerankerSpec(_Strict, kw_only=True):
    """A causal-LM reranker: the prompt it was trained on and the logits its score reads.

    The prompt is a row of pieces, each tokenized on its own (the model cards tokenize them so,
    which fixes where token boundaries fall) and concatenated::

        [BOS] head... query middle... document tail...

    ``{instruction}`` may appear in ``head`` and ``tail`` pieces, ``{query}`` in ``query``,
    ``{document}`` in ``document``. Score = sigmoid(logit(yes) - logit(no)) at the last position
    (= softmax([no, yes])[1]); sigmoid(logit(yes)) when the card reads one token only.
    """

    head: tuple[str, ...] = ()
    query: str = "{query}"  # the query is truncated (max_query_tokens) inside this piece
    middle: tuple[str, ...] = ()
    document: str = "{document}"  # one piece per document chunk: keep any label in `middle`
    tail: tuple[str, ...] = ()
    bos: bool = False  # prepend the tokenizer's BOS id, as the card does
    # How a non-empty instruction is written into {instruction}; an empty one writes nothing.
    instruction_format: str = "{instruction}"
    default_instruction: str = ""
    yes_token: str
    no_token: str | None = None
    # vLLM's pooling runner: the documented online conversion into a one-logit classifier
    # (W[yes] - W[no], or W[yes]); the gateway applies the sigmoid itself.
    vllm_hf_overrides: dict[str, Any] = {}


_QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
# Qwen2.5's default system turn, which mxbai-rerank-v2's chat prefix repeats.
_QWEN25_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"

# The LLM rerankers this gateway knows, by family name; prompts and scoring from their cards.
LLM_RERANKERS: dict[str, LlmRerankerSpec] = {
    # Qwen3-Reranker model card and vLLM's examples/offline_inference/qwen3_reranker.py (engines.md).
    # Cut so that the part a request shares ends at "<Document>:" (pieces tokenize as one string:
    # the pre-tokenizer splits after ":" before a space and around special tokens).
    "qwen3": LlmRerankerSpec(
        head=(_QWEN3_PREFIX + "<Instruct>: {instruction}\n<Query>:",),
        query=" {query}\n<Document>:",
        document=" {document}",
        tail=("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",),
        default_instruction=DEFAULT_INSTRUCTION,
        yes_token="yes",
        no_token="no",
        vllm_hf_overrides={
            "architectures": ["Qwen3ForSequenceClassification"],
            "classifier_from_token": ["no", "yes"],
            "is_original_qwen3_reranker": True,
        },
    ),
    # BAAI/bge-reranker-v2-gemma model card ("For LLM-based reranker", get_inputs), the same as
    # FlagEmbedding's FlagLLMReranker and vLLM's tests/models/language/pooling/
    # test_bge_reranker_v2_gemma.py: [BOS] "A: {query}" "\n" "B: {passage}" "\n" prompt; the
    # score is the raw logit of "Yes" at the last position (normalize=True: its sigmoid). The
    # card's `prompt` argument is the instruction, and it comes after the passage.
    "bge-reranker-v2-gemma": LlmRerankerSpec(
        query="A: {query}",
        middle=("\n", "B:"),
        document=" {document}",
        tail=("\n", "{instruction}"),
        bos=True,
        default_instruction=(
            "Given a query A and a passage B, determine whether the passage contains an answer to "
            "the query by providing a prediction of either 'Yes' or 'No'."
        ),
        yes_token="Yes",
        vllm_hf_overrides={
            "architectures": ["GemmaForSequenceClassification"],
            "classifier_from_token": ["Yes"],
            "method": "no_post_processing",
        },
    ),
    # mixedbread-ai/mxbai-rerank-{base,large}-v2: github.com/mixedbread-ai/mxbai-rerank,
    # mxbai_rerank/mxbai_rerank_v2.py (MxbaiRerankV2: chat prefix, "[instruction: {i}\n]query:
    # {q}", sep "\n", "document: {d}", sep, task prompt, chat suffix; logits = logit("1") -
    # logit("0") at the last position, sigmoid > 0.5 = relevant). vLLM's
    # tests/models/language/pooling/test_mxbai_rerank.py converts the same two tokens.
    "mxbai-rerank-v2": LlmRerankerSpec(
        head=(_QWEN25_SYSTEM + "<|im_start|>user\n", "{instruction}query:"),
        query=" {query}",
        middle=("\n", "document:"),
        document=" {document}",
        tail=(
            "\n",
            "You are a search relevance expert who evaluates how well documents match search queries. "
            "For each query-document pair, carefully analyze the semantic relationship between them, "
            "then provide your binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:",
            "<|im_end|>\n<|im_start|>assistant\n",
        ),
        instruction_format="instruction: {instruction}\n",
        yes_token="1",
        no_token="0",
        vllm_hf_overrides={
            "architectures": ["Qwen2ForSequenceClassification"],
            "classifier_from_token": ["0", "1"],
            "method": "from_2_way_softmax",
        },
    ),
}

# Why a runtime cannot run a family, where "it is not listed" would leave the user guessing.
_PACKED_QWEN3_ONLY = (
    "packed runs Qwen3's layer layout only (no attention biases as Qwen2 has, no Gemma "
    "embedding scale, (1 + w) RMSNorm or GeGLU); use transformers or vllm-score"
)
_PACKED_NO_BI_ENCODER = ("packed runs Qwen3 rerankers and cross-encoders (BERT, ELECTRA, RoBERTa, XLM-R, ModernBERT); "
                         "use transformers or openvino")
RUNTIME_REFUSALS: dict[tuple[str, str], str] = {
    ("bge-reranker-v2-gemma", "packed"): _PACKED_QWEN3_ONLY,
    ("mxbai-rerank-v2", "packed"): _PACKED_QWEN3_ONLY,
    ("bi-encoder", "packed"): _PACKED_NO_BI_ENCODER,
}

# Cross-encoder architectures (config.json model_type) the packed runtime's encoder layers run:
# post-norm BERT-style layers with absolute positions (adapters/runtimes/packed/encoder_forward.py)
# and ModernBERT (RoPE, alternating global / local attention, GeGLU, pre-norm:
# modernbert_forward.py). DeBERTa-v2 (disentangled relative attention) is other arithmetic.
PACKED_ENCODER_TYPES: frozenset[str] = frozenset({"bert", "electra", "roberta", "xlm-roberta", "modernbert"})


def packed_runs_checkpoint(hf_config: dict[str, Any]) -> bool:
    """Whether engine 'packed' runs this checkpoint (its config.json): Qwen3, or a cross-encoder it supports."""
    model_type = hf_config.get("model_type")
    if model_type == "qwen3":
        return True
    heads = [a for a in hf_config.get("architectures") or () if str(a).endswith("ForSequenceClassification")]
    return bool(heads) and packed_encoder_refusal(hf_config) is None


def packed_encoder_refusal(hf_config: dict[str, Any]) -> str | None:
    """Why the packed runtime cannot run this cross-encoder checkpoint (its config.json), or None."""
    model_type = str(hf_config.get("model_type") or "?")
    if model_type not in PACKED_ENCODER_TYPES:
        return (f"engine 'packed' runs BERT, ELECTRA, RoBERTa, XLM-R and ModernBERT cross-encoders, not model_type "
                f"'{model_type}'; use engine = 'transformers' (or 'openvino' on CPU, 'vllm-score')")
    position = hf_config.get("position_embedding_type", "absolute")
    if position not in (None, "absolute"):
        return (f"engine 'packed' runs absolute position embeddings, not position_embedding_type "
                f"'{position}'; use engine = 'transformers'")
    return None

# Which runtimes (the `engine` tag) can run which family. "auto" is checked once the family is
# detected from the checkpoint (at start, and by `rerank-gateway check-config`).
FAMILY_RUNTIMES: dict[str, frozenset[str]] = {
    # "packed": the Qwen3-only runtime that packs prompts without padding (adapters/runtimes/packed).
    "qwen3": frozenset({"transformers", "vllm-score", "vllm-generate", "packed", "gguf"}),
    # The other LLM rerankers (LLM_RERANKERS): vLLM converts them online like Qwen3; the packed
    # kernels fit Qwen3 only (RUNTIME_REFUSALS); llama.cpp's converter writes no such head;
    # vllm-generate reads two tokens' log-probabilities, and Gemma's score is one raw logit.
    "bge-reranker-v2-gemma": frozenset({"transformers", "vllm-score"}),
    "mxbai-rerank-v2": frozenset({"transformers", "vllm-score"}),
    # Sequence-classification heads: vLLM serves BERT/XLM-R classifiers on its pooling runner;
    # llama.cpp runs GGUF conversions that kept the head (rank pooling).
    # "openvino": the CPU runtime exported from the checkpoint (adapters/runtimes/cpu).
    # "packed": BERT / ELECTRA / RoBERTa / XLM-R / ModernBERT pairs packed without padding (PACKED_ENCODER_TYPES).
    "cross-encoder": frozenset({"transformers", "vllm-score", "gguf", "openvino", "packed"}),
    # Embeddings + cosine: no prompt, nothing to generate.
    "bi-encoder": frozenset({"transformers", "openvino"}),
    # Listwise remote code (model.rerank); provided by the jina-v3 family.
    "jina-v3": frozenset({"transformers"}),
}


class LocalModelConfig(ModelConfig):
    """A checkpoint scored in-process: the gateway tokenizes (and templates) itself.

    ``engine`` names the runtime, ``family`` how a (query, document) pair becomes tokens and
    the model's output a score.
    """

    path: str = DEFAULT_MODEL_PATH  # hub id or local directory of the checkpoint
    revision: str | None = None  # hub revision (branch, tag or commit); None: the default branch
    # "auto": read the checkpoint's config.json (architectures, id2label) and
    # sentence-transformers files (modules.json, 1_Pooling/) and log the choice.
    family: FamilyName = "auto"
    # LLM rerankers (qwen3, bge-reranker-v2-gemma, mxbai-rerank-v2): the instruction used when
    # the request has none; None: the family's (Qwen3: DEFAULT_INSTRUCTION, Gemma: its card's
    # prompt, mxbai: none). Other families have no instruction slot.
    instruction: str | None = None
    # Tokens per prompt (template + query + one document chunk); longer documents are chunked.
    # Capped at the checkpoint's own window (e.g. 512 for BERT / XLM-R cross-encoders); a value too
    # small for the prompt template fails at start.
    max_length: Positive = 8192
    # Longer queries are truncated (Cohere truncates queries too). Cross-encoders cap it at half
    # the window so a long query cannot crowd out the document.
    max_query_tokens: Positive = 2048
    # Default chunk cap when the request names none (Cohere's OpenAPI default).
    max_chunks_per_doc: Positive = 10
    # Return the model's raw output instead of a score in [0, 1]: a cross-encoder's logit, a
    # bi-encoder's cosine in [-1, 1] (default: sigmoid/softmax, and (1 + cos) / 2).
    raw_scores: bool = False
    # Cross-encoders: the head's activation. "auto": the checkpoint's declared one
    # (sentence-transformers' activation_fn), else sigmoid for one label, softmax for several.
    activation: Literal["auto", "sigmoid", "softmax"] = "auto"
    # Cross-encoders with several labels: the index of the "relevant" label (None: read from
    # id2label, else the last label).
    positive_label: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # Bi-encoders: pooling of token embeddings ("auto": from 1_Pooling/config.json, either
    # sentence-transformers layout; mean without one). sentence-transformers' own mode names.
    pooling: Literal["auto", "mean", "cls", "lasttoken", "max", "weightedmean", "mean_sqrt_len_tokens"] = "auto"
    # Families shipped as remote code (jina-v3) need it; never on by default.
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        engine = str(type(self).__struct_config__.tag)
        if self.family != "auto" and engine not in FAMILY_RUNTIMES.get(self.family, frozenset()):
            raise ValueError(runtime_refusal(self.family, engine))


def runtime_refusal(family: str, engine: str) -> str:
    """One line: why ``family`` cannot run on ``engine`` and which engines can."""
    runtimes = ", ".join(sorted(FAMILY_RUNTIMES.get(family, ())))
    why = RUNTIME_REFUSALS.get((family, engine)) or f"it runs on: {runtimes or 'none'}"
    return f"family {family!r} cannot run on engine {engine!r} ({why})"


# Kept for code written before families existed.
Qwen3LocalConfig = LocalModelConfig


class TransformersEngineConfig(LocalModelConfig, tag="transformers"):
    """In-process Hugging Face transformers, CPU or CUDA: length-sorted batches in worker threads."""

    device: str = "auto"  # "auto" (CUDA if available), "cpu", "cuda", "cuda:1", ...
    # "auto": float32 on CPU, bfloat16 on CUDA (float16 where bfloat16 is unsupported).
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Padded tokens (longest prompt x rows) per forward pass, and rows per pass.
    batch_tokens: Positive = 16_384
    max_batch_size: Positive = 64  # rows per forward pass
    # Forward passes running at once in worker threads (torch already uses every core).
    max_parallel_batches: Positive = 1
    # Listwise families (jina-v3): documents per model.rerank call (the old service's batch_size;
    # 64 was its T4 advice, 125 stays closer to one full listwise window at more latency).
    block_size: Positive = 64


class PackedEngineConfig(LocalModelConfig, tag="packed"):
    """Qwen3-Reranker or a cross-encoder (BERT, ELECTRA, RoBERTa, XLM-R) packed without padding
    into varlen steps filled from every waiting request."""

    # One model replica per device, all fed from one queue: ["cuda:0", "cuda:1"]; "auto": cuda:0, else cpu.
    # With split = "pipeline": the devices one model's layers are divided over, in order.
    devices: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)] = ("auto",)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # "auto": float32 on CPU, bfloat16 on CUDA
    # Tokens computed per step (one forward pass) on a device (with share_prefix a request's shared
    # prefix counts once per step); a longer prompt gets a step alone.
    batch_tokens: Positive = 16_384
    max_items_per_step: Positive = 1024  # prompts per step
    # Compute each request's shared prompt part (system + instruction + query) once per step, its
    # documents' tokens attending to it, instead of once per document (same scores, fewer GEMMs).
    share_prefix: bool = True
    # Which waiting request fills a step first: arrival order, or fewest tokens left.
    policy: Literal["fifo", "shortest-first"] = "fifo"
    # torch.compile(dynamic=True) of the pointwise work between the GEMMs; "auto": on CUDA only.
    compile: Literal["auto", "on", "off"] = "auto"
    # "auto": varlen flash attention on CUDA (vLLM's FA3 when vLLM is installed, else flash-attn or
    # PyTorch's varlen_attn), exact per-prompt SDPA on CPU.
    attention: Literal["auto", "varlen", "sdpa"] = "auto"
    # "fp8": the GEMMs in e4m3 (weights quantized at load, one scale per output channel; activations
    # per token), attention and norms in bf16. Kept only if bf16's top-10 order survives on >= 99 %
    # of a golden set's queries, checked at load (adapters/runtimes/packed/gate.py). "auto": `dtype`.
    precision: Literal["auto", "fp8"] = "auto"
    # A failed gate: "refuse" the model (one line saying by how much), or "warn": serve it anyway
    # (for an operator who has checked the ranking on their own data); /ready shows the gate's figures.
    precision_gate: Literal["refuse", "warn"] = "refuse"
    # "pipeline": ONE model split over all of `devices` (two or more, in order), each holding a
    # contiguous range of the layers, one step in flight per device; for a model that does not fit
    # one device. "none": a whole replica per device (data parallel: faster whenever it fits).
    split: Literal["none", "pipeline"] = "none"
    # With split = "pipeline": decoder layers per device, in the order of `devices` (e.g. [19, 17]
    # for a faster first GPU); they must add up to the model's layers. None: as even as possible.
    split_layers: tuple[Positive, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.split == "pipeline" and len(self.devices) < 2:
            raise ValueError(f"split = 'pipeline' needs at least 2 devices, got devices = {list(self.devices)}; "
                             f"list them, e.g. [\"cuda:0\", \"cuda:1\"], or drop split")
        if self.split_layers is not None and self.split != "pipeline":
            raise ValueError("split_layers is only read with split = 'pipeline'; set split or drop split_layers")
        if self.split_layers is not None and len(self.split_layers) != len(self.devices):
            raise ValueError(f"split_layers has {len(self.split_layers)} entries for {len(self.devices)} devices; "
                             f"give one layer count per device")
        if self.family == "cross-encoder" and self.split != "none":
            raise ValueError("split = 'pipeline' is for Qwen3 rerankers on engine 'packed'; a cross-encoder fits one "
                             "device: list several devices for one replica each")
        if self.family == "cross-encoder" and self.precision != "auto":
            raise ValueError("precision = 'fp8' is for Qwen3 rerankers on engine 'packed'; cross-encoders run in `dtype`")


class OpenVinoEngineConfig(LocalModelConfig, tag="openvino"):
    """Encoder families (cross-encoder, bi-encoder) on OpenVINO's CPU plugin.

    The checkpoint is exported to OpenVINO IR on first load and cached on disk (keyed by the
    weights' hash, the export options and the library versions); the gateway still tokenizes,
    truncates, chunks and dedups. Measured against the other CPU runtimes in docs/cpu-runtimes.md.
    """

    # "fp32": equals the transformers engine (and sentence-transformers) within 1e-4.
    # "bf16" / "int8": faster, admitted only when the parity gate below keeps the ranking.
    precision: Literal["fp32", "bf16", "int8"] = "fp32"
    # Where exported models live; None: $XDG_CACHE_HOME/rerank-gateway/openvino (~/.cache/...).
    cache_dir: str | None = None
    # CPU threads in all (None: the cores this process may run on).
    threads: Positive | None = None
    # Inferences in flight at once, each on its share of the threads (None: what OpenVINO's
    # throughput hint picks).
    streams: Positive | None = None
    # Rows are sorted by length and cut into batches of at most this many padded tokens
    # (small batches of near-equal lengths: no padding waste, and every stream gets work).
    batch_tokens: Positive = 2048
    # ... and at most this many rows per batch.
    max_batch_size: Positive = 16
    # "shared": a free stream's batch takes rows of neighbouring lengths from the oldest waiting
    # requests together (less padding under concurrency; a row's score may move ~1e-7 with its
    # batch). "per-request": batches never mix requests (scores repeat exactly whatever else runs).
    batching: Literal["shared", "per-request"] = "shared"
    # Parity gate of bf16 / int8, run at start: a golden set of this many queries is scored in
    # fp32 and in the reduced precision.
    parity_queries: Positive = 32
    # Documents per golden query.
    parity_documents: Annotated[int, msgspec.Meta(ge=10)] = 30
    # The precision is refused unless at least this share of the queries keep their fp32 top-10
    # (same documents, same order).
    parity_min_agreement: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.99
    # Swaps of documents whose fp32 scores differ by less than this are not counted as changes.
    parity_tie: Annotated[float, msgspec.Meta(ge=0)] = 1e-3
    # A JSON Lines file of {"query": ..., "documents": [...]} (real traffic) used as the golden
    # set instead of the generated one.
    parity_set: str | None = None
    # bf16 / int8 only: re-score in fp32 the documents the reduced precision cannot order within
    # each request's top this-many (their reduced scores closer to a neighbour's than twice the
    # error measured at start), so that top order is fp32's; 0: off. The gate checks the result.
    refine_top: Annotated[int, msgspec.Meta(ge=0)] = 0
    # The error bound refinement trusts: this many times the largest score change measured at
    # start on calibration queries (not the golden ones the gate then checks).
    refine_margin: Annotated[float, msgspec.Meta(ge=0)] = 1.5
    # Rounds of fp32 re-scoring per request: 1 re-scores both sides of every pair the bound leaves
    # open at once; more re-score one side first (an exact score settles most pairs) and look again,
    # the last round taking every side left (docs/cpu-runtimes.md; fewer documents, more steps).
    refine_rounds: Annotated[int, msgspec.Meta(ge=1)] = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.refine_top and self.precision == "fp32":
            raise ValueError("refine_top re-scores a reduced precision's uncertain documents in fp32; with "
                             "precision = 'fp32' every score already is: set precision = 'bf16' or 'int8', or drop refine_top")


class VllmEngineConfig(LocalModelConfig):
    """A local model on vLLM's async engine; ``max_length`` is also vLLM's ``max_model_len``."""


    # "auto": float32 on CPU, bfloat16 on CUDA.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Fraction of GPU memory vLLM may take (weights + KV cache); on CPU, of RAM for the KV cache.
    # None: 0.9 on CUDA, 0.1 on CPU (where 0.9 would reserve most of the machine's RAM).
    gpu_memory_utilization: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    tensor_parallel_size: Positive = 1  # GPUs one model is split over (vLLM tensor parallelism)
    # Skip CUDA graphs / compilation: faster start, slower steps.
    enforce_eager: bool = False
    # Sequences and tokens per scheduler step (None: vLLM's defaults for the device).
    max_num_seqs: Positive | None = None
    max_num_batched_tokens: Positive | None = None  # see max_num_seqs
    # vLLM attention backend name (e.g. "TRITON_ATTN" or "FLEX_ATTENTION" on pre-Ampere GPUs); None: vLLM picks.
    attention_backend: str | None = None
    # Reuse the KV of the shared prompt part (system + instruction + query) across documents.
    # Causal families only: a cross-encoder's attention is bidirectional, so it is always off there.
    enable_prefix_caching: bool = True
    # Any other AsyncEngineArgs field, passed through as is (wins over the keys above).
    engine_args: dict[str, Any] = {}


class VllmScoreEngineConfig(VllmEngineConfig, tag="vllm-score"):
    """Pooling runner: Qwen3 converted online to a yes-minus-no classifier, or a cross-encoder's own head."""


class VllmGenerateEngineConfig(VllmEngineConfig, tag="vllm-generate"):
    """Causal LM, one generated token; the score is P(yes) from the yes and no log-probabilities."""


class StaticEngineConfig(ModelConfig, tag="static"):
    """Zero-cost test engine: a fixed score per document, no model. For tests and benchmarks."""

    score: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5  # every document's score unless `scores` lists it
    # Scores by exact document text; documents not listed get `score`.
    scores: dict[str, Annotated[float, msgspec.Meta(ge=0, le=1)]] = {}
    # Simulated inference time per request (tests of timeouts and overload; latency models).
    delay_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    # Answer raw-score requests (TEI `raw_scores`, vLLM `use_activation: false`) with the
    # logit of the score; false makes the engine one that has no raw output. Not the local
    # models' `raw_scores` (always answer raw): a static model answers raw only when asked.
    supports_raw_scores: bool = True


class UpstreamHttpConfig(ModelConfig):
    """Fields of engines that score over HTTP. ``timeout_s`` is the total per request, retries included."""

    connect_timeout_s: PositiveFloat = 5.0  # longest wait for a TCP + TLS connection to the upstream
    # Longest wait for the upstream's answer to one call.
    read_timeout_s: PositiveFloat = 30.0
    # The key sent as ``Authorization: Bearer``; or the name of an environment variable holding it.
    api_key: str | None = None
    api_key_env: str | None = None  # see api_key
    # Keep-alive connections per upstream host.
    max_connections: Positive = 64
    # Instruction used when the request has none; "" sends none (the upstream's default applies).
    instruction: str = ""


class DashScopeEngineConfig(UpstreamHttpConfig, tag="dashscope", kw_only=True):
    """Alibaba DashScope text rerank. Requests over the model's limits are split and merged."""

    # The upstream model name (gte-rerank-v2, qwen3-rerank, ...).
    model: ModelName
    # "native" = /api/v1/services/rerank/text-rerank/text-rerank; "compatible" = /compatible-api/v1/reranks.
    endpoint: Literal["native", "compatible"] = "native"
    # Region host (Beijing by default); e.g. https://dashscope-intl.aliyuncs.com for Singapore.
    base_url: str = "https://dashscope.aliyuncs.com"
    api_key_env: str | None = "DASHSCOPE_API_KEY"  # the environment variable holding the key (when api_key is unset)
    workspace: str | None = None  # DashScope workspace id, sent as X-DashScope-WorkSpace; None: the default
    # The model's limits (DashScope docs, they vary by model and region): one upstream call
    # never exceeds them; larger requests become several calls.
    max_documents_per_call: Positive = 500
    max_tokens_per_item: Positive = 4000  # see max_documents_per_call
    max_tokens_per_request: Positive = 30_000  # see max_documents_per_call
    max_parallel_calls: Positive = 4  # upstream calls of one split request in flight at once
    # Retries of one call after 429, 5xx or a connect error (exponential backoff, jitter, Retry-After).
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    backoff_initial_s: PositiveFloat = 0.5  # first retry delay, doubled each time (with jitter) ...
    backoff_max_s: PositiveFloat = 10.0  # ... up to this


class PoolEngineConfig(UpstreamHttpConfig, tag="pool", kw_only=True):
    """A model served by replicas of vLLM, TEI, Infinity or a Cohere-compatible server."""

    # The replicas' API: vllm (/rerank), vllm-score (/score), tei, infinity, cohere (/v2/rerank).
    protocol: Literal["vllm", "vllm-score", "tei", "infinity", "cohere"]
    urls: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)]  # base URLs of the replicas
    # The model name sent upstream (None: omitted; the cohere protocol sends `name`).
    model: str | None = None
    # Texts per upstream call; None: the whole request in one call (32 for tei, its default limit).
    max_batch: Positive | None = None
    # Route one (instruction, query) to the same replica so its prompt prefix stays cached...
    affinity: bool = True
    # ... unless that replica has more than this many requests in flight beyond the least busy one.
    affinity_slack: Annotated[int, msgspec.Meta(ge=0)] = 4
    # Send the instruction upstream (vllm/cohere protocols; tei and infinity have no such field).
    forward_instruction: bool = True
    # Passive health: eject a replica after this many consecutive failures, for cooldown_s,
    # then probe health_path before sending it traffic again.
    eject_after_failures: Positive = 3
    cooldown_s: PositiveFloat = 10.0  # how long an ejected replica gets no traffic
    health_path: str = "/health"  # probed (GET, 200 expected) before an ejected replica is used again
    probe_timeout_s: PositiveFloat = 2.0  # time limit of that probe


class GgufEngineConfig(ModelConfig, tag="gguf", kw_only=True):
    """A GGUF reranker on llama.cpp (llama-cpp-python), CPU or GPU, with rank pooling.

    The GGUF must carry a rerank head (``cls``/``cls.output`` tensors, as llama.cpp's converter
    writes for sequence-classification checkpoints and Qwen3-Reranker); one without is refused
    at load, since llama.cpp would score it with near-zero garbage.
    """

    # The .gguf file (a local path: llama.cpp reads no hub ids).
    path: str
    # "auto": from the GGUF's general.architecture (qwen3 -> "qwen3", encoders -> "cross-encoder").
    family: Literal["auto", "qwen3", "cross-encoder"] = "auto"
    # Tokens per prompt (template + query + one document chunk); None: the model's training
    # context (512 for BERT / XLM-R rerankers). Longer documents are chunked.
    max_length: Positive | None = None
    max_query_tokens: Positive = 2048  # longer queries are truncated (at most half the window)
    max_chunks_per_doc: Positive = 10  # default chunk cap when the request names none
    # Layers offloaded to the GPU (0: CPU only, -1: all); needs a CUDA/Metal build of llama-cpp-python.
    n_gpu_layers: Annotated[int, msgspec.Meta(ge=-1)] = 0
    # CPU threads for llama.cpp (None: llama-cpp-python's default, the physical cores).
    n_threads: Positive | None = None
    # Tokens per llama_decode call: prompts are grouped up to this many tokens (a longer prompt,
    # up to the window, is decoded alone; the context always holds the window). Every sequence of
    # a call attends over the whole call's tokens (masked), so large calls cost quadratically:
    # 1024 scored 5.1x the docs/s of 8192 with the same scores (docs/engines-gguf.md).
    batch_tokens: Positive = 1024
    max_batch_size: Annotated[int, msgspec.Meta(ge=1, le=256)] = 64  # see batch_tokens
    # Return the head's raw output (a cross-encoder's logit) instead of a score in [0, 1].
    raw_scores: bool = False


EngineConfig = (
    TransformersEngineConfig
    | PackedEngineConfig
    | OpenVinoEngineConfig
    | VllmScoreEngineConfig
    | VllmGenerateEngineConfig
    | StaticEngineConfig
    | DashScopeEngineConfig
    | PoolEngineConfig
    | GgufEngineConfig
)


class DialectsConfig(_Strict):
    """The non-Cohere request dialects (TEI's /rerank body and /info, vLLM's /score)."""

    # The model that serves TEI-shaped requests and GET /info (TEI bodies name no model);
    # None: the first configured model.
    tei_model: ModelName | None = None
    # Cohere's `return_documents` defaults to false, Jina's (and vLLM's /rerank) to true, and both
    # APIs post the same body to the same path: only the model name a client sends tells them
    # apart. A /v1/rerank or /rerank body whose `model` (as sent, before aliases) matches one of
    # these glob patterns and leaves `return_documents` out (or null) gets Jina's default, true;
    # every other body Cohere's, false. ["*"]: true for every such body, an absent model included
    # (a deployment for Jina or vLLM clients); []: Cohere's default everywhere. /v2/rerank is
    # Cohere v2 only and keeps false.
    jina_models: tuple[ModelName, ...] = ("jina-*",)


class Settings(_Strict):
    server: ServerConfig = ServerConfig()
    logging: LoggingConfig = LoggingConfig()
    limits: LimitsConfig = LimitsConfig()
    auth: AuthConfig = AuthConfig()
    dialects: DialectsConfig = DialectsConfig()
    cache: CacheConfig = CacheConfig()
    models: tuple[EngineConfig, ...] = ()
