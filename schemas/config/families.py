"""Which family runs on which runtime: the LLM-reranker presets, the runtime refusals and the
checkpoint checks of the packed runtime (read by the engine configs and by preflight)."""

from __future__ import annotations

from typing import Any

import msgspec

from .base import DEFAULT_INSTRUCTION, _Strict


class LlmRerankerSpec(_Strict, kw_only=True, frozen=True):
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
    vllm_hf_overrides: dict[str, Any] = msgspec.field(default_factory=dict)


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
            (
                "You are a search relevance expert who evaluates how well documents match search queries. "
                "For each query-document pair, carefully analyze the semantic relationship between them, "
                "then provide your binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
            ),
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
_PACKED_NO_BI_ENCODER = (
    "packed runs Qwen3 rerankers and cross-encoders (BERT, ELECTRA, RoBERTa, XLM-R, ModernBERT); "
    "use transformers or openvino"
)
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


def packed_encoder_refusal(hf_config: dict[str, Any], precision: str = "auto") -> str | None:
    """Why the packed runtime cannot run this cross-encoder checkpoint (its config.json) in
    ``precision`` (the engine config's), or None."""
    model_type = str(hf_config.get("model_type") or "?")
    if precision == "fp8" and model_type == "modernbert":
        # Its layers are another forward (pre-norm, bias-free GeGLU MLP, global / local attention:
        # modernbert_forward) whose quantizing regions are not written yet.
        return (
            "precision = 'fp8' on engine 'packed' runs BERT, ELECTRA, RoBERTa and XLM-R cross-encoders; "
            "ModernBERT's layers (pre-norm, gated GeGLU MLP) have no FP8 forward yet: drop precision"
        )
    if model_type not in PACKED_ENCODER_TYPES:
        return (
            f"engine 'packed' runs BERT, ELECTRA, RoBERTa, XLM-R and ModernBERT cross-encoders, not model_type "
            f"'{model_type}'; use engine = 'transformers' (or 'openvino' on CPU, 'vllm-score')"
        )
    position = hf_config.get("position_embedding_type", "absolute")
    if position not in (None, "absolute"):
        return (
            f"engine 'packed' runs absolute position embeddings, not position_embedding_type "
            f"'{position}'; use engine = 'transformers'"
        )
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


def runtime_refusal(family: str, engine: str) -> str:
    """One line: why ``family`` cannot run on ``engine`` and which engines can."""
    runtimes = ", ".join(sorted(FAMILY_RUNTIMES.get(family, ())))
    why = RUNTIME_REFUSALS.get((family, engine)) or f"it runs on: {runtimes or 'none'}"
    return f"family {family!r} cannot run on engine {engine!r} ({why})"
