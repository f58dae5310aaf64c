"""The gateway as a real process on loopback: the official cohere SDK, the log line, start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import cohere
import httpx
import pytest

from tests import reference
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

QUERY = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Quantum computing uses qubits.",
]
SECRET_DOC = "zebra-unicorn-marker-text 42"


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    from tests.conftest import ServerProcess

    srv = ServerProcess(
        f"""
[logging]
format = "json"

[[models]]
name = "tiny"
engine = "transformers"
path = "{tiny_qwen3_dir}"
dtype = "float32"
""",
        tmp_path_factory.mktemp("server"),
    )
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _expected_order(tiny_dir):
    scores = reference.score_texts(tiny_dir, QUERY, DOCS)
    return scores, sorted(range(len(DOCS)), key=lambda i: -scores[i])


def test_cohere_sdk_v1_client(server, tiny_qwen3_dir):
    scores, order = _expected_order(tiny_qwen3_dir)
    co = cohere.Client(api_key="test-key", base_url=server.url)
    resp = co.rerank(model="tiny", query=QUERY, documents=DOCS, top_n=3, return_documents=True)
    assert [r.index for r in resp.results] == order[:3]
    assert [r.relevance_score for r in resp.results] == pytest.approx([scores[i] for i in order[:3]], abs=1e-5)
    assert resp.results[0].document.text == DOCS[order[0]]
    assert resp.meta.api_version.version == "1"


def test_cohere_sdk_v2_client(server, tiny_qwen3_dir):
    scores, order = _expected_order(tiny_qwen3_dir)
    co = cohere.ClientV2(api_key="test-key", base_url=server.url)
    resp = co.rerank(model="tiny", query=QUERY, documents=DOCS, max_tokens_per_doc=None)
    assert [r.index for r in resp.results] == order
    assert [r.relevance_score for r in resp.results] == pytest.approx([scores[i] for i in order], abs=1e-5)


def test_cohere_sdk_typed_errors(server):
    co = cohere.ClientV2(api_key="test-key", base_url=server.url)
    with pytest.raises(cohere.errors.UnprocessableEntityError) as unprocessable:
        co.rerank(model="tiny", query="   ", documents=DOCS)
    assert "query must not be empty" in unprocessable.value.body["message"]
    with pytest.raises(cohere.errors.NotFoundError) as not_found:
        co.rerank(model="no-such-model", query=QUERY, documents=DOCS)
    assert "not found" in not_found.value.body["message"]


def test_one_log_line_per_request_without_text_or_credentials(server):
    resp = httpx.post(
        f"{server.url}/v2/rerank",
        json={"model": "tiny", "query": "needle-query-text", "documents": [SECRET_DOC, "other"]},
        headers={"x-request-id": "log-test-1", "authorization": "Bearer sk-very-secret-key-value"},
    )
    assert resp.status_code == 200
    bad = httpx.post(
        f"{server.url}/v1/rerank", json={"query": "", "documents": [SECRET_DOC]}, headers={"x-request-id": "log-test-2"}
    )
    assert bad.status_code == 422
    deadline = time.monotonic() + 10
    while '"log-test-2"' not in server.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    ok_lines = [line for line in lines if line.get("request_id") == "log-test-1"]
    assert len(ok_lines) == 1
    line = ok_lines[0]
    assert line["event"] == "request" and line["route"] == "/v2/rerank" and line["status"] == 200
    assert line["model"] == "tiny" and line["documents"] == 2 and line["tokens"] > 0 and line["latency_ms"] > 0
    err = [line for line in lines if line.get("request_id") == "log-test-2"]
    assert len(err) == 1 and err[0]["status"] == 422
    text = server.output()
    for secret in (SECRET_DOC, "needle-query-text", "sk-very-secret-key-value"):
        assert secret not in text


def test_default_config_without_weights_serves_503_with_hint(gateway_server, tmp_path):
    """No config: the default model is Qwen/Qwen3-Reranker-0.6B; offline it cannot load, and the
    gateway says so instead of crashing."""
    srv = gateway_server("", env={"HF_HUB_OFFLINE": "1"}, wait=False)
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, srv.output()
        try:
            ready = httpx.get(f"{srv.url}/ready", timeout=2)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        if ready.json()["models"][0]["state"] != "loading":
            break
        time.sleep(0.2)
    assert httpx.get(f"{srv.url}/health").status_code == 200
    assert ready.status_code == 503
    model = ready.json()["models"][0]
    assert model["name"] == "qwen3-reranker-0.6b" and model["state"] == "failed"
    # The cause is the network (here: offline mode), and the fix says so (issue 22).
    assert "HF_HUB_OFFLINE is set" in model["error"] and "no config.json" not in model["error"]
    assert "HF_HUB_OFFLINE is set" in model["fix"]
    resp = httpx.post(f"{srv.url}/v2/rerank", json={"model": "qwen3-reranker-0.6b", "query": "q", "documents": ["d"]})
    assert resp.status_code == 503 and "local directory" in resp.json()["message"]
    assert "Retry-After" in resp.headers


def test_check_config_reports_one_clear_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nport = "eighty"\n[[models]]\nname = "x"\nengine = "static"\n')
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", "--config", str(bad)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "server.port: expected an integer" in run.stderr
    good = tmp_path / "good.toml"
    good.write_text('[[models]]\nname = "x"\nengine = "static"\n')
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", "--config", str(good)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and "config OK" in run.stdout


def test_importing_the_app_loads_no_engine_library():
    code = (
        "import sys, gateway.app, gateway.cli; "
        "heavy = {'torch', 'transformers', 'vllm', 'llama_cpp'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60, env={**os.environ})


@pytest.mark.parametrize("runner", ["uvicorn", "granian"])
def test_both_asgi_runners_serve(gateway_server, runner):
    srv = gateway_server(f'[server]\nrunner = "{runner}"\n[[models]]\nname = "s"\nengine = "static"\n')
    resp = httpx.post(f"{srv.url}/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
    assert resp.status_code == 200 and len(resp.json()["results"]) == 2
    assert resp.headers["x-request-id"]


_MAPPED_TWICE = """
import ctypes, sys
from gateway.config.settings import load_settings
from gateway.launch.servers import bound_malloc_retention

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
pinned = bound_malloc_retention(load_settings(sys.argv[1], environ={}))
# A 4 MiB body, freed, then another: mmapped both times (returned to the OS when freed) only
# while the threshold stays put; glibc's adaptation serves the second from the heap.
a = bytearray(4 << 20); first = libc.mallinfo2().hblkhd; del a
b = bytearray(4 << 20); second = libc.mallinfo2().hblkhd; del b
print(pinned, first >= 4 << 20, second >= 4 << 20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or "musl" in " ".join(os.uname()), reason="glibc only")
@pytest.mark.parametrize(
    ("engine", "env", "expected"),
    [
        ("static", {}, "True True True"),
        ("transformers", {}, "False True False"),  # torch in this process: its tensors keep glibc's default
        ("static", {"MALLOC_MMAP_THRESHOLD_": str(8 << 20)}, "False False False"),
    ],  # the user's own setting wins
)
def test_serving_processes_keep_large_bodies_out_of_the_heap(tmp_path, engine, env, expected):
    config = tmp_path / "g.toml"
    config.write_text(
        f'[[models]]\nname = "m"\nengine = "{engine}"\npath = "x"\n'
        if engine != "static"
        else '[[models]]\nname = "m"\nengine = "static"\n'
    )
    run = subprocess.run(
        [sys.executable, "-c", _MAPPED_TWICE, str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-3:] == expected.split()
