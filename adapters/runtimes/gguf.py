"""GGUF rerankers on llama.cpp (llama-cpp-python), in-process, CPU or GPU (``n_gpu_layers``).

llama.cpp scores a (query, document) pair with *rank pooling*: the model runs the whole prompt
and its classification head (``cls`` = dense + tanh, then ``cls.output``) turns the first
token's state into ``n_cls_out`` numbers. What those numbers mean depends on the model, and
we follow llama.cpp's own graph (``src/llama-graph.cpp``, ``LLAMA_POOLING_TYPE_RANK``):

- encoders (BERT, XLM-R: bge-reranker-*, ms-marco cross-encoders): the head's raw logit. Its
  server returns it as is; we apply the sigmoid once (what sentence-transformers does for one
  label), or softmax and take the last label for several.
- Qwen3 (and Qwen3-VL): the graph already applies softmax over the ``[yes, no]`` rows, so the
  first number *is* P(yes); applying a sigmoid again would squeeze every score into
  [0.5, 0.73] (node-llama-cpp#617). We take it as is.

A GGUF converted without the head (community "embedding" conversions, Qwen3 causal-LM GGUFs)
still loads with rank pooling in llama.cpp and silently returns near-zero scores
(llama.cpp#25447), so :func:`inspect_gguf` reads the file's tensor list first and refuses it.

Prompt layout, as llama.cpp's server builds it (``format_prompt_rerank``): the GGUF's
``rerank`` chat template with ``{query}`` and ``{document}`` when it has one, else
``[BOS] query [EOS] [SEP] document [EOS]`` (each special as the vocab asks). The gateway owns
tokenization (truncation and chunking happen in token space), so the template is cut into a
head (up to and including the query), the document and a tail, tokenized apart.

A llama.cpp context is not thread-safe: one worker thread at a time runs ``llama_decode``
(a capacity limiter of 1), in bounded batches (``batch_tokens`` tokens, ``max_batch_size``
sequences), so concurrent requests interleave batch by batch and the event loop keeps serving.
Imported only through ``adapters.registry``: importing it loads llama.cpp's shared library.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from adapters.base import EngineConfigError, EngineError, EngineUnavailableError, ScoreJob, ScoreResult
from schemas.config import GgufEngineConfig

__all__ = ("GgufEngine", "GgufInfo", "GgufPromptTokenizer", "NoRerankHeadError", "inspect_gguf", "plan_decodes")

# Architectures whose rank-pooling graph ends in a softmax (llama-graph.cpp): output 0 is P(yes).
_SOFTMAX_ARCHS = frozenset({"qwen3", "qwen3vl"})
# Without a --max_length, prompts are capped like the other local engines' default.
_DEFAULT_WINDOW = 8192


class NoRerankHeadError(EngineConfigError):
    """The GGUF has no classification head: rank pooling would return meaningless scores."""


@dataclass(frozen=True)
class GgufInfo:
    """What the GGUF file says about itself, read without loading the model."""

    path: str
    architecture: str
    context_length: int | None
    pooling_type: int | None
    file_type: str
    labels: tuple[str, ...]
    has_cls: bool
    has_cls_out: bool
    cls_out_rows: int | None
    rerank_template: str | None
    # Rows of the token-type table (BERT: 2, XLM-R: 1); None when the file does not say.
    token_type_count: int | None = None

    @property
    def family(self) -> str:
        return "qwen3" if self.architecture in _SOFTMAX_ARCHS else "cross-encoder"

    @property
    def n_outputs(self) -> int:
        if self.labels:
            return len(self.labels)
        return self.cls_out_rows or 1


def inspect_gguf(path: str) -> GgufInfo:
    """Read the GGUF's metadata and tensor names (memory-mapped; no weights are computed on)."""
    import gguf

    reader = gguf.GGUFReader(path)

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    arch = str(value("general.architecture") or "")
    tensors = {t.name: t for t in reader.tensors}
    cls_out = tensors.get("cls.output.weight")
    ftype = value("general.file_type")
    try:
        file_type = gguf.LlamaFileType(ftype).name.removeprefix("ALL_").removeprefix("MOSTLY_").lower()
    except (TypeError, ValueError):
        file_type = "unknown"
    return GgufInfo(
        path=path,
        architecture=arch,
        context_length=value(f"{arch}.context_length"),
        pooling_type=value(f"{arch}.pooling_type"),
        file_type=file_type,
        labels=tuple(value(f"{arch}.classifier.output_labels") or ()),
        has_cls="cls.weight" in tensors,
        has_cls_out=cls_out is not None,
        # GGUF shapes are (in, out): the second dimension counts the head's outputs.
        cls_out_rows=int(cls_out.shape[-1]) if cls_out is not None else None,
        rerank_template=value("tokenizer.chat_template.rerank"),
        # GGUF shapes are (in, out): the second dimension counts the table's rows.
        token_type_count=int(types.shape[-1]) if (types := tensors.get("token_types.weight")) is not None else None,
    )


def check_rerank_head(info: GgufInfo) -> None:
    if info.has_cls_out or info.has_cls:
        return
    raise NoRerankHeadError(
        f"{info.path} has no rerank head (no cls / cls.output tensors; architecture "
        f"{info.architecture!r}): llama.cpp would score every document near zero. Use a GGUF "
        "converted from the sequence-classification checkpoint by llama.cpp's convert_hf_to_gguf.py "
        "(bge-reranker-*, or Qwen3-Reranker converted by llama.cpp after PR #14029, which writes "
        "the yes/no head and the rerank template)"
    )


def plan_decodes(lengths: Sequence[int], *, batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Group prompts (by index, input order) into llama_decode calls within both bounds."""
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if current and (tokens + n > batch_tokens or len(current) >= max_batch_size):
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        batches.append(current)
    return batches


class GgufPromptTokenizer:
    """:class:`adapters.base.PromptTokenizer` over the GGUF's own vocabulary (llama.cpp tokenizer).

    User text is tokenized with special-token parsing off (a document cannot inject ``</s>``);
    template text with it on.
    """

    def __init__(self, llm: Any, info: GgufInfo, *, max_length: int, max_query_tokens: int) -> None:
        import llama_cpp

        self._llm = llm
        self._max_length = max_length
        self.default_instruction = ""  # the template's own (the service sends it when a request has none)
        self._instruct_at: tuple[int, int] | None = None  # where it lies in the head's text
        self._heads: dict[str, list[int]] = {}  # head ids by request instruction
        self._max_query_tokens = max_query_tokens
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        template = info.rerank_template
        if template is not None:
            (head, between), tail = _split_template(template)
            # A space before a placeholder goes with the text it precedes ("<Query>: " + "q" ->
            # "<Query>:" + " q"): BPE vocabularies attach a space to the following word, so this is
            # how the whole rendered prompt tokenizes.
            self._query_space, self._doc_space = head.endswith(" "), between.endswith(" ")
            self._head_text = head.removesuffix(" ")
            self._head_ids = self._tokenize(self._head_text, special=True)
            # Qwen3's template (llama.cpp's converter) holds its default instruction as
            # "<Instruct>: ...\n<Query>:": a request's own instruction replaces it, as in the
            # reference prompt; a template without that line has none to replace.
            start = head.find(_INSTRUCT)
            end = head.find(_QUERY_LINE, start + len(_INSTRUCT)) if start >= 0 else -1
            if end >= 0:
                self._instruct_at = (start + len(_INSTRUCT), end)
                self.default_instruction = head[start + len(_INSTRUCT) : end]
            self._between_ids = self._tokenize(between.removesuffix(" "), special=True)
            self._suffix_ids = self._tokenize(tail, special=True)
        else:
            # llama.cpp's default layout (server-common.cpp, format_prompt_rerank).
            bos = llama_cpp.llama_vocab_bos(vocab)
            eos = llama_cpp.llama_vocab_eos(vocab)
            sep = llama_cpp.llama_vocab_sep(vocab)
            if eos < 0:
                eos = sep
            add_bos = llama_cpp.llama_vocab_get_add_bos(vocab) and bos >= 0
            add_eos = llama_cpp.llama_vocab_get_add_eos(vocab) and eos >= 0
            add_sep = llama_cpp.llama_vocab_get_add_sep(vocab) and sep >= 0
            self._head_ids = [bos] if add_bos else []
            self._between_ids = ([eos] if add_eos else []) + ([sep] if add_sep else [])
            self._suffix_ids = [eos] if add_eos else []
            self._query_space = self._doc_space = False
        fixed = len(self._head_ids) + len(self._between_ids) + len(self._suffix_ids)
        if max_length < fixed + 2:
            raise ValueError(f"max_length={max_length} leaves no room for a query and a document ({fixed} template tokens)")
        # A query may take at most half the window, so a document always has room (Cohere's rule too).
        self._max_query_tokens = min(max_query_tokens, (max_length - fixed) // 2)

    # -- PromptTokenizer -------------------------------------------------------------------
    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def suffix_length(self) -> int:
        return len(self._suffix_ids)

    def item_room(self, shared_ids: Sequence[int]) -> int:
        return self._max_length - len(shared_ids) - len(self._suffix_ids)

    def encode_shared(self, query: str, instruction: str) -> list[int]:
        query_ids = self._tokenize((" " if self._query_space else "") + query, special=False)
        return [*self._head(instruction), *query_ids[: self._max_query_tokens], *self._between_ids]

    def _head(self, instruction: str) -> list[int]:
        """The template's head with ``instruction`` in its instruction line (empty: the template's own)."""
        if self._instruct_at is None or not instruction or instruction == self.default_instruction:
            return self._head_ids
        ids = self._heads.get(instruction)
        if ids is None:
            a, b = self._instruct_at
            before = self._head_text[:a]
            # The space after "<Instruct>:" goes with the instruction, as with the query (BPE attaches
            # a space to the word after it); special-token parsing off for the request's text (it
            # cannot inject <|im_end|>), on for the template's.
            ids = [*self._tokenize(before.removesuffix(" "), special=True),
                   *self._tokenize((" " if before.endswith(" ") else "") + instruction, special=False),
                   *self._tokenize(self._head_text[b:], special=True)]
            if len(self._heads) < 64:  # a few instructions per deployment; others are tokenized per request
                self._heads[instruction] = ids
        return ids

    def encode_documents(self, documents: Sequence[str]) -> list[list[int]]:
        prefix = " " if self._doc_space else ""
        return [self._tokenize(prefix + d, special=False) for d in documents]

    def assemble(self, shared_ids: Sequence[int], item_ids: Sequence[int]) -> list[int]:
        return [*shared_ids, *item_ids, *self._suffix_ids]

    def _tokenize(self, text: str, *, special: bool) -> list[int]:
        if not text:
            return []
        return list(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=special))


_INSTRUCT, _QUERY_LINE = "<Instruct>: ", "\n<Query>:"


def _split_template(template: str) -> tuple[tuple[str, str], str]:
    """``A{query}B{document}C`` -> ((A, B), C); the shared part (A, query, B) must come first."""
    q, d = template.find("{query}"), template.find("{document}")
    if q < 0 or d < 0 or q > d:
        raise ValueError("the GGUF's rerank template must contain {query} before {document}")
    return (template[:q], template[q + len("{query}") : d]), template[d + len("{document}") :]


class GgufEngine:
    """:class:`adapters.base.RerankEngine` for a GGUF reranker on llama.cpp."""

    runtime = "gguf"

    def __init__(self, config: GgufEngineConfig) -> None:
        self._config = config
        self._info: GgufInfo | None = None
        self._llm: Any = None
        self._prompt: GgufPromptTokenizer | None = None
        self._batch: Any = None
        self._n_batch = 0
        # One llama_decode at a time: a llama.cpp context is not thread-safe.
        self._limiter = anyio.CapacityLimiter(1)

    @property
    def tokenizer(self) -> GgufPromptTokenizer | None:
        return self._prompt if self._llm is not None else None

    @property
    def supports_raw_scores(self) -> bool:
        # Qwen3's rank output is already a probability: there is no logit to return.
        return self._info is not None and self._info.family == "cross-encoder"

    def describe(self) -> dict[str, str]:
        """Family, runtime, device and dtype for /ready and /v1/models."""
        cfg = self._config
        out = {"runtime": self.runtime, "device": "cpu" if cfg.n_gpu_layers == 0 else f"gpu ({cfg.n_gpu_layers} layers)"}
        info = self._info
        if info is not None:
            out["dtype"] = info.file_type
            out["family"] = info.family
            out["family_reason"] = f"GGUF general.architecture = {info.architecture!r}, rank pooling"
        else:
            out["family"] = cfg.family
        return out

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._load)

    async def stop(self) -> None:
        llm, self._llm, self._prompt = self._llm, None, None
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.close()
        if llm is not None:
            await anyio.to_thread.run_sync(llm.close, limiter=self._limiter)

    async def check_health(self) -> None:
        if self._llm is None:
            raise EngineUnavailableError("model is not loaded")

    async def score(self, job: ScoreJob) -> ScoreResult:
        prompt, info = self._prompt, self._info
        if prompt is None or info is None or self._llm is None:
            raise EngineUnavailableError("model is not loaded")
        prompts = [prompt.assemble(job.shared_ids, item) for item in job.item_ids]
        outputs: list[list[float]] = [[] for _ in prompts]
        # Batches are planned at batch_tokens, not at the context's size: every sequence of one
        # llama_decode attends over the whole batch's KV cells (masked), so the attention cost
        # grows with the square of a batch's tokens. A prompt longer than batch_tokens (up to the
        # window, which n_ctx always holds) is decoded alone.
        for batch in plan_decodes(
            [len(p) for p in prompts], batch_tokens=self._config.batch_tokens, max_batch_size=self._config.max_batch_size
        ):
            out = await anyio.to_thread.run_sync(self._decode, [prompts[i] for i in batch], limiter=self._limiter)
            for i, vec in zip(batch, out, strict=True):
                outputs[i] = vec
        scores = [_score(vec, info, raw=job.raw_scores) for vec in outputs]
        return ScoreResult(scores=scores, input_tokens=sum(len(p) for p in prompts))

    # -- worker-thread code ----------------------------------------------------------------
    def _load(self) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaBatch

        cfg = self._config
        if not os.path.isfile(cfg.path):
            # A ValueError, not an OSError: the hub download hint of other engines does not apply.
            raise ValueError(f"{cfg.path}: no such file; engine 'gguf' needs the path of a local .gguf file")
        info = inspect_gguf(cfg.path)
        check_rerank_head(info)
        if cfg.family != "auto" and cfg.family != info.family:
            raise ValueError(
                f"{cfg.path} is a {info.family} GGUF (architecture {info.architecture!r}), not {cfg.family!r}; "
                "set family = \"auto\" or the matching family"
            )
        if info.family == "cross-encoder" and (info.token_type_count or 0) > 1:
            # llama.cpp's BERT graph adds token type 0 to every token ("token types are hardcoded
            # to zero"): a pair model trained with type 1 on the document would score otherwise.
            raise ValueError(
                f"{cfg.path}: this cross-encoder has {info.token_type_count} token types (BERT pairs: type 1 on the "
                "document) and llama.cpp gives every token type 0, so its scores would differ from the checkpoint's; "
                "serve the checkpoint with engine = 'transformers' (or 'packed', 'openvino', 'vllm-score')"
            )
        if cfg.raw_scores and info.family != "cross-encoder":
            raise ValueError("raw_scores: this GGUF's rank output is already a probability (Qwen3); it has no logit")
        if cfg.n_gpu_layers != 0 and not llama_cpp.llama_supports_gpu_offload():
            raise ValueError(
                "n_gpu_layers is set but this llama-cpp-python build has no GPU support; reinstall it with "
                "CMAKE_ARGS='-DGGML_CUDA=on' pip install --no-binary llama-cpp-python llama-cpp-python, or set n_gpu_layers = 0"
            )
        trained = info.context_length or _DEFAULT_WINDOW
        window = min(cfg.max_length or _DEFAULT_WINDOW, trained)
        # An encoder must see a whole prompt in one micro-batch: n_ubatch = n_batch >= window.
        n_batch = max(cfg.batch_tokens, window)
        kwargs: dict[str, Any] = {}
        if cfg.n_threads is not None:
            kwargs["n_threads"] = kwargs["n_threads_batch"] = cfg.n_threads
        llm = llama_cpp.Llama(
            model_path=cfg.path,
            embedding=True,
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
            n_ctx=n_batch,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_gpu_layers=cfg.n_gpu_layers,
            verbose=False,
            **kwargs,
        )
        try:
            prompt = GgufPromptTokenizer(llm, info, max_length=window, max_query_tokens=cfg.max_query_tokens)
            batch = LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=cfg.max_batch_size, verbose=False)
        except BaseException:
            llm.close()
            raise
        self._info, self._prompt, self._batch, self._n_batch, self._llm = info, prompt, batch, n_batch, llm

    def _decode(self, prompts: list[list[int]]) -> list[list[float]]:
        import llama_cpp

        llm, batch, info = self._llm, self._batch, self._info
        if llm is None or batch is None or info is None:
            raise EngineUnavailableError("model is not loaded")
        ctx = llm.ctx
        n_out = info.n_outputs
        batch.reset()
        for seq, ids in enumerate(prompts):
            batch.add_sequence(ids, seq, True)
        # A causal model (Qwen3) keeps a KV cache: start every batch from an empty one.
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        rc = llama_cpp.llama_decode(ctx, batch.batch)
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc}")
        out: list[list[float]] = []
        for seq in range(len(prompts)):
            ptr = llama_cpp.llama_get_embeddings_seq(ctx, seq)
            if not ptr:
                raise EngineError("llama.cpp returned no rank output for a sequence")
            out.append([float(ptr[k]) for k in range(n_out)])
        batch.reset()
        return out


def _score(vec: list[float], info: GgufInfo, *, raw: bool) -> float:
    if info.family == "qwen3":
        return vec[0]  # already softmax([yes, no])[0] inside llama.cpp's graph
    if len(vec) == 1:
        logit = vec[0]
        return logit if raw else _sigmoid(logit)
    # Several labels: softmax, the last label is the "relevant" one (LABEL_1 of a 2-way head).
    if raw:
        return vec[-1]
    top = max(vec)
    exps = [math.exp(v - top) for v in vec]
    return exps[-1] / sum(exps)


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
