"""Review of ``RerankService._overlapped`` (a large request submitted in parts): the same
error bodies as one job (a part over the chunk limit counted only its own chunks, and refused
before one job's 413 for a document too long further on).

Runs the packed engine on CPU (the tiny XLM-R), ``overlaps_tokenizing`` set by hand, as
``tests/test_overlap.py`` does."""

from __future__ import annotations

import pytest

from gateway.errors import PayloadTooLargeError
from gateway.serving.service import LongTexts, RerankService
from schemas.config import LimitsConfig
from tests.corpus import DOCS
from tests.test_overlap import _request, served  # noqa: F401  (the fixture: the same tiny XLM-R engine)

pytestmark = pytest.mark.anyio

# 80 distinct documents: the parts are documents 0-7, 8-23, 24-47 and 48-79; document 50 (in
# the last part) is long enough to be chunked (or refused with long_texts reject).
TEXTS = [f"{DOCS[i % len(DOCS)][:80]} number {i}" for i in range(80)]
TEXTS[50] = " ".join(DOCS) * 6


async def _error(registry, rt, overlap: bool, limits: LimitsConfig, **kw) -> PayloadTooLargeError:
    rt.engine.overlaps_tokenizing = overlap
    try:
        with pytest.raises(PayloadTooLargeError) as info:
            await RerankService(registry, limits).rerank(_request(TEXTS), api_version="1", request_id="r", **kw)
    finally:
        rt.engine.overlaps_tokenizing = False
    assert rt.in_flight == 0
    return info.value


@pytest.mark.parametrize(
    ("max_total_chunks", "long_texts"),
    [
        (30, None),  # the last part alone is over the limit: the count must be the request's
        (10, LongTexts(mode="reject")),  # the second part is over it, but one job refuses document 50 first
    ],
)
async def test_refusals_are_the_one_job_refusals(served, max_total_chunks, long_texts):
    registry, rt = served
    limits = LimitsConfig(max_total_chunks=max_total_chunks)
    kw = {} if long_texts is None else {"long_texts": long_texts}
    one = await _error(registry, rt, False, limits, **kw)
    two = await _error(registry, rt, True, limits, **kw)
    assert (type(two), str(two)) == (type(one), str(one))
