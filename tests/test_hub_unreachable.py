"""A model on the hub that this machine cannot fetch fails in one probe, naming the cause.

huggingface_hub retries an unreachable host five times with back-off (23-26 s per load attempt)
before falling back to its cache. The gateway probes first (adapters/families/hub.py) and never
calls the download when the probe fails: these tests replace the download with one that fails
the test, so "fast" is shown by the download not being called, not by a clock. Each cause has
its own words: offline mode, a name that does not resolve, a host that takes no connection, and
an HTTP answer (here a proxy's 403 from a real local server).
"""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator

import pytest

from adapters.families import hub
from adapters.families.detect import read_model_files
from gateway.serving.load_failures import fix_for
from gateway.serving.models import describe_exception
from schemas.config import TransformersEngineConfig
from tests.conftest import free_port

REPO = "rerank-gateway-tests/not-in-any-cache"


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Not offline, an empty hub cache, no proxy: the probe decides."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the hub was asked (23 s of retries) although the probe had failed")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", refuse)


def _failure(path: str = REPO) -> tuple[str, str]:
    with pytest.raises(OSError) as err:
        read_model_files(path)
    return describe_exception(err.value), fix_for(TransformersEngineConfig(name="m", path=path), 0, err.value)


def test_offline_mode_is_named_as_offline_mode(monkeypatch: pytest.MonkeyPatch, no_download: None) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cause, fix = _failure()
    assert "HF_HUB_OFFLINE is set" in cause and "unreachable" not in cause
    assert "HF_HUB_OFFLINE is set" in fix and f"hf download {REPO} --local-dir DIR" in fix


def test_a_name_that_does_not_resolve_is_named_dns(
    monkeypatch: pytest.MonkeyPatch, online: None, no_download: None
) -> None:
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "https://huggingface.invalid")
    cause, fix = _failure()
    assert "huggingface.invalid does not resolve (DNS" in cause and "HF_HUB_OFFLINE" not in cause
    assert "does not resolve" in fix and "local directory" in fix


def test_a_host_that_takes_no_connection_is_named_so(
    monkeypatch: pytest.MonkeyPatch, online: None, no_download: None
) -> None:
    port = free_port()  # bound and released: nothing listens there
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", f"http://127.0.0.1:{port}")
    cause, fix = _failure()
    assert f"127.0.0.1:{port} resolves but takes no connection" in cause and "refused" in cause.lower()
    assert "takes no connection" in fix


@pytest.fixture
def refusing_proxy() -> Iterator[str]:
    """A real HTTP server on loopback that answers every request 403, as a filtering proxy does."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            self.send_response(403)
            self.send_header("content-length", "0")
            self.end_headers()

        do_GET = do_HEAD = _refuse

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_an_http_answer_is_named_with_its_status(
    monkeypatch: pytest.MonkeyPatch, online: None, refusing_proxy: str
) -> None:
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", refusing_proxy)
    # The client itself reads these at import (the suite runs offline): this test lets it ask.
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    template = refusing_proxy + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr("huggingface_hub.constants.HUGGINGFACE_CO_URL_TEMPLATE", template)
    cause, _ = _failure()
    assert "HTTP 403" in cause, cause


def test_a_cached_file_is_read_without_asking_an_unreachable_hub(
    monkeypatch: pytest.MonkeyPatch, online: None, no_download: None, tmp_path
) -> None:
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "https://huggingface.invalid")
    seen: list[str] = []

    def cached(repo: str, name: str, revision: str | None = None) -> str | None:
        seen.append(name)
        if name != "config.json":
            return None
        file = tmp_path / "config.json"
        file.write_text('{"architectures": ["Qwen3ForCausalLM"]}')
        return str(file)

    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", cached)
    with pytest.raises(hub.HubUnreachableError):  # config.json is cached, modules.json is unknown
        read_model_files(REPO)
    assert seen[:2] == ["config.json", "modules.json"]


def test_ready_says_what_a_load_attempt_is_doing() -> None:
    """/ready's "doing": hub or local path, the attempt and how long it has run (not just "loading")."""
    import asyncio

    from gateway.serving.models import ModelRuntime
    from schemas.config import ServerConfig

    async def scenario() -> tuple[dict, dict]:
        runtime = ModelRuntime(TransformersEngineConfig(name="m", path=REPO), 0, ServerConfig())
        started, release = asyncio.Event(), asyncio.Event()

        async def start() -> None:
            started.set()
            await release.wait()

        runtime._start_engine = start  # type: ignore[method-assign]
        task = asyncio.create_task(runtime.load())
        await asyncio.wait_for(started.wait(), 10)
        during = runtime.status()
        release.set()
        await asyncio.wait_for(task, 10)
        return during, runtime.status()

    during, after = asyncio.run(scenario())
    assert during["state"] == "loading"
    assert during["doing"].startswith(f"fetching '{REPO}' from the Hugging Face hub")
    assert re.search(r"\(attempt 1, \d+ s so far\)$", during["doing"]), during["doing"]
    assert after["state"] == "ready" and "doing" not in after
    local = ModelRuntime(TransformersEngineConfig(name="m", path="/models/x"), 0, ServerConfig())
    local.load_attempts = 1
    assert local.loading_activity() == "reading '/models/x' and starting the engine (attempt 1)"
