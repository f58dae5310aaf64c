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

# What the file says about itself (read before llama.cpp loads it), the prompt layout and the
# engine live in the modules below; the names are handed on here, where adapters.registry and
# the tests import them.
from adapters.runtimes.gguf.engine import GgufEngine, plan_decodes
from adapters.runtimes.gguf.metadata import GgufInfo, NoRerankHeadError, inspect_gguf
from adapters.runtimes.gguf.metadata import check_rerank_head as check_rerank_head  # outside __all__, as before
from adapters.runtimes.gguf.prompt import GgufPromptTokenizer

__all__ = ("GgufEngine", "GgufInfo", "GgufPromptTokenizer", "NoRerankHeadError", "inspect_gguf", "plan_decodes")
