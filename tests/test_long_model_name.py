"""A model name far longer than any configured one (a megabyte inside a valid body) is refused
with a short 4xx: it reaches neither the answer nor the access log line in full."""

from __future__ import annotations

import json
import time

import httpx

CONFIG = '[logging]\nformat = "json"\n[[models]]\nengine = "static"\nname = "static"\n'
ROUTES = {
    "/v1/rerank": ({"query": "q", "documents": ["a"]}, 422),
    "/v2/rerank": ({"query": "q", "documents": ["a"]}, 422),
    "/score": ({"text_1": "q", "text_2": ["a"]}, 400),  # vLLM's dialect answers 400 for 422
}


def _log_line(server, rid: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [line for line in server.output().splitlines() if f'"request_id":"{rid}"' in line]
        if lines:
            return lines[-1]
        time.sleep(0.1)
    raise AssertionError(f"no log line for {rid}")


def test_a_huge_model_name_is_refused_briefly(gateway_server) -> None:
    server = gateway_server(CONFIG)
    for path, (body, status) in ROUTES.items():
        rid = "huge" + path.replace("/", "-")
        resp = httpx.post(
            f"{server.url}{path}", json={"model": "m" * 1_000_000, **body}, headers={"x-request-id": rid}, timeout=30
        )
        assert resp.status_code == status, resp.text[:300]
        assert len(resp.content) < 1000 and "$.model" in resp.text, resp.text[:300]
        line = _log_line(server, rid)
        assert len(line) < 1000 and json.loads(line)["status"] == status, line[:300]
        # The longest name a config can hold still gets the usual 404.
        resp = httpx.post(f"{server.url}{path}", json={"model": "m" * 256, **body}, timeout=30)
        assert resp.status_code == 404, resp.text[:300]
