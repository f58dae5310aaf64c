"""The request dialects besides Cohere's: Hugging Face TEI's ``/rerank`` body and ``/info``, and
vLLM's ``/score``. Each one only translates: its body into one or more calls of the same
:class:`gateway.serving.service.RerankService` as the Cohere routes (so dedup, truncation,
chunk-and-max, keys, limits, usage metrics and logs are identical), and the outcome and errors
into its server's shapes.

- :mod:`.detect`: which dialect a ``/rerank`` body speaks, decided by its shape at decode.
- :mod:`.tei`: TEI's rerank and info, TEI's error body and statuses.
- :mod:`.vllm`: vLLM's score API, vLLM's error body.
"""

from __future__ import annotations

from gateway.http.dialects.detect import DetectedRequest, RerankDialectBody, rerank_error_response
from gateway.http.dialects.tei import tei_info, tei_rerank
from gateway.http.dialects.vllm import score

__all__ = ("DIALECT_ROUTES", "DetectedRequest", "RerankDialectBody", "rerank_error_response", "tei_rerank")

DIALECT_ROUTES = [tei_info, score]
