"""Bench never writes a key, even part of one, into its outputs."""

from __future__ import annotations

import asyncio

import httpx

from gateway.bench.driver import Endpoint, _send
from gateway.bench.redact import REDACTED, Redactor
from gateway.bench.workload import BenchRequest

KEY = "rk-" + "S3cr3tK3yMaterial" * 3  # 54 characters


def test_an_error_body_echoing_the_key_cut_mid_key_is_still_redacted() -> None:
    # An upstream that quotes the key it refused; the driver keeps the first 120 characters.
    body = '{"error": "invalid api key, the server received the following credential: ' + KEY + '"}'
    assert body.index(KEY) < 120 < body.index(KEY) + len(KEY)  # the cut falls inside the key

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, text=body)

    async def one() -> str | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(reply)) as client:
            ep = Endpoint(
                label="x", url="http://x/v2/rerank", headers={"Authorization": f"Bearer {KEY}"}, requests=[], warmup=[]
            )
            req = BenchRequest(
                body=b"{}",
                documents=1,
                expected_results=1,
                content_tokens=1,
                query_tokens=1,
                doc_tokens=1,
                unique_documents=1,
            )
            return (await _send(client, ep, req, 0.0, 0.0)).error

    error = asyncio.run(one())
    assert error is not None
    scrubbed = Redactor(keys=[KEY], headers=[], urls=[]).scrub(error)
    leaked = KEY[: 120 - body.index(KEY)]
    # Before: the 42 first characters of the key stayed in bench.json's first_error.
    assert leaked not in scrubbed, scrubbed
    assert scrubbed.endswith(REDACTED)
