"""What every dialect's handler does around the service call: the log line and timing headers."""

from __future__ import annotations

from typing import Any

from gateway.http.middleware import log_fields
from gateway.serving.service import RerankOutcome

__all__ = ("finish",)


def finish(dialect: str, outcomes: list[RerankOutcome], documents: int) -> dict[str, str]:
    """Fill the request's log line from the outcome(s) and return the timing headers.

    A vLLM score request with several queries is several service calls: their items, tokens
    and times add up, as they would had one call scored everything.
    """
    fields: dict[str, Any] = log_fields()
    fields.update(
        dialect=dialect,
        model=outcomes[0].model,
        documents=documents,
        items=sum(o.items for o in outcomes),
        tokens=sum(o.input_tokens for o in outcomes),
    )
    headers = {
        "x-tokenize-time-ms": f"{sum(o.tokenize_ms for o in outcomes):.2f}",
        "x-inference-time-ms": f"{sum(o.inference_ms for o in outcomes):.2f}",
    }
    # A chain: the target(s) that computed the scores (several queries of one vLLM score request
    # may have been served by different targets: each is named once, in order).
    targets = list(dict.fromkeys(o.target for o in outcomes if o.target is not None))
    if targets:
        headers["x-rerank-target"] = fields["target"] = ",".join(targets)
    return headers
