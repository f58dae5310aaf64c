"""``rerank-gateway bench`` against real servers on loopback: the gateway (static engine) and the
minimal Cohere-compatible stub of ``benchmarks.stub_upstream``; plus the workload generator."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.bench.workload import LengthSpec, WorkloadSpec, build_workload, load_token_counter
from tests.conftest import ROOT, free_port, wait_http_ok

STATIC = """
[logging]
level = "WARNING"
[[models]]
name = "static"
engine = "static"
"""


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "bench", *args, "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/health", proc, deadline=time.monotonic() + 30, what="stub upstream", interval=0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_length_spec_parses_fixed_and_ranges() -> None:
    assert LengthSpec.parse("100") == LengthSpec(100, 100)
    assert LengthSpec.parse("50-150") == LengthSpec(50, 150)
    for bad in ("0", "9-3", "abc", "1-"):
        with pytest.raises(ValueError):
            LengthSpec.parse(bad)


def test_workload_is_deterministic_with_duplicates_and_word_lengths() -> None:
    spec = WorkloadSpec(
        requests=3,
        documents=20,
        doc_tokens="5-9",
        query_tokens="4",
        duplicate_share=0.25,
        top_n=5,
        instruction="find it",
        model="m",
        seed=7,
    )
    a, b = build_workload(spec), build_workload(spec)
    assert [r.body for r in a] == [r.body for r in b]
    body = json.loads(a[0].body)
    assert body["model"] == "m" and body["top_n"] == 5 and body["instruction"] == "find it"
    assert len(body["documents"]) == 20 and len(set(body["documents"])) == a[0].unique_documents == 15
    assert all(5 <= len(d.split()) <= 9 for d in body["documents"])
    assert a[0].query_tokens == 4 and a[0].content_tokens == 4 * 20 + a[0].doc_tokens
    assert a[0].expected_results == 5
    assert build_workload(WorkloadSpec(requests=1, seed=8))[0].body != build_workload(WorkloadSpec(requests=1))[0].body


def test_report_gives_percentiles_of_each_server_timing_phase() -> None:
    from gateway.bench.driver import LevelRun, Sample
    from gateway.bench.report import markdown_table, summarize

    # 99 quick requests and one whose inference took 50 ms: the mean hides it, p99 / max show it.
    def sample(i: int, inference: float) -> Sample:
        return Sample(
            start_s=i,
            latency_s=(inference + 3.5) / 1e3,
            status=200,
            ok=True,
            documents=1,
            content_tokens=1,
            process_ms=inference + 2.0,
            tokenize_ms=2.0,
            inference_ms=inference,
        )

    run = LevelRun(
        endpoint="gw",
        mode="closed",
        concurrency=1,
        wall_s=1.0,
        samples=[sample(i, 10.0) for i in range(99)] + [sample(99, 50.0)],
    )
    s = summarize(run)
    pct = s["server_timing_pct_ms"]
    assert set(pct) == {"process", "tokenize", "inference", "outside_server"}
    assert pct["inference"]["p50"] == pytest.approx(10.0) and pct["inference"]["max"] == pytest.approx(50.0)
    assert 10.0 < pct["inference"]["p99"] < 50.0 and s["server_timing_ms"]["inference"] == pytest.approx(10.4)
    assert pct["outside_server"]["p50"] == pytest.approx(1.5) and pct["tokenize"]["p99"] == pytest.approx(2.0)
    assert "inference 10.40 (10.00 / 10.40 / 50.00)" in markdown_table([s])


def test_exact_token_lengths_with_the_model_tokenizer(tiny_qwen3_dir: Path) -> None:
    counter = load_token_counter(str(tiny_qwen3_dir))
    reqs = build_workload(WorkloadSpec(requests=2, documents=30, doc_tokens="20-40", query_tokens="6"), counter)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_qwen3_dir / "tokenizer.json"))
    for r in reqs:
        docs = json.loads(r.body)["documents"]
        lengths = [len(tok.encode(f" {d}", add_special_tokens=False).ids) for d in docs]
        # Cut at a token boundary: re-encoding may merge across the cut by a token at most.
        assert all(19 <= n <= 40 for n in lengths), lengths
        assert r.doc_tokens == sum(lengths)


@pytest.mark.slow
def test_bench_sweeps_the_gateway_and_writes_reports(gateway_server, tmp_path: Path) -> None:
    server = gateway_server(STATIC)
    out = tmp_path / "sweep"
    proc = bench(
        f"{server.url}/v1/rerank",
        "--model",
        "static",
        "--requests",
        "12",
        "--concurrency",
        "1,3",
        "--documents",
        "10",
        "--duplicates",
        "0.2",
        "--top-n",
        "3",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "bench.json").read_text())
    assert [(s["concurrency"], s["requests"], s["ok"]) for s in doc["summaries"]] == [(1, 12, 12), (3, 12, 12)]
    for s in doc["summaries"]:
        assert s["errors"] == {} and s["docs_per_s"] == pytest.approx(10 * s["req_per_s"])
        assert 0 < s["latency_ms"]["p50"] <= s["latency_ms"]["p99"] <= s["latency_ms"]["max"]
        # The gateway reports its token count; the bench turns it into a rate.
        assert s["server_tokens_per_s"] > 0
        # Our timing headers split the latency: server work vs what lies outside the server.
        t = s["server_timing_ms"]
        assert set(t) == {"process", "tokenize", "inference", "outside_server"}
        assert 0 < t["process"] < s["latency_ms"]["mean"]
    assert "8.0 unique documents per request" in doc["measured"]
    report = (out / "report.md").read_text()
    assert "| endpoint | load |" in report and "3 clients" in report
    for png in ("latency_cdf.png", "throughput.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_compare_alternates_two_endpoints_and_reports_ratios(gateway_server, stub_url: str, tmp_path: Path) -> None:
    server = gateway_server(STATIC)
    out = tmp_path / "cmp"
    proc = bench(
        server.url,
        "--model",
        "static",
        "--compare",
        stub_url,
        "--label",
        "gw",
        "--compare-label",
        "stub",
        "--requests",
        "10",
        "--concurrency",
        "2",
        "--documents",
        "5",
        "--no-plot",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "bench.json").read_text())
    assert [(s["endpoint"], s["ok"]) for s in doc["summaries"]] == [("gw", 10), ("stub", 10)]
    (cmp,) = doc["comparisons"]
    assert (cmp["a"], cmp["b"], cmp["round_size"]) == ("gw", "stub", 2)
    assert cmp["ratios"]["req_per_s"] > 0
    assert "**gw / stub**" in (out / "report.md").read_text()
    by = {s["endpoint"]: s for s in doc["summaries"]}
    assert by["gw"]["wall_s"] > 0 and by["stub"]["wall_s"] > 0
    assert by["gw"]["server_timing_ms"] and by["stub"]["server_timing_ms"] is None  # the stub sends no timing


@pytest.mark.slow
def test_open_loop_keeps_the_schedule(stub_url: str, tmp_path: Path) -> None:
    out = tmp_path / "open"
    proc = bench(
        stub_url,
        "--model",
        "m",
        "--rate",
        "40",
        "--requests",
        "9",
        "--documents",
        "3",
        "--warmup",
        "0",
        "--no-plot",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    (s,) = json.loads((out / "bench.json").read_text())["summaries"]
    assert (s["mode"], s["rate"], s["ok"]) == ("open", 40.0, 9)
    assert s["wall_s"] >= 8 / 40  # the last request is scheduled 0.2 s after the first


@pytest.mark.slow
def test_errors_are_counted_by_status_and_fail_the_run(gateway_server, tmp_path: Path) -> None:
    server = gateway_server(STATIC)
    out = tmp_path / "err"
    proc = bench(
        server.url,
        "--model",
        "no-such-model",
        "--requests",
        "4",
        "--documents",
        "2",
        "--warmup",
        "0",
        "--no-plot",
        "--out",
        str(out),
    )
    assert proc.returncode == 1
    (s,) = json.loads((out / "bench.json").read_text())["summaries"]
    assert s["ok"] == 0 and s["errors"] == {"404": 4}
    assert "no-such-model" in proc.stderr  # the first error's body is shown


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    proc = bench("not-a-url", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "not an http(s) URL" in proc.stderr


@pytest.mark.slow
def test_without_matplotlib_results_are_written_and_plots_skipped_in_one_line(stub_url: str, tmp_path: Path) -> None:
    out = tmp_path / "noplot"
    # sys.modules[name] = None makes `import matplotlib` raise ImportError, as on an install without it.
    code = (
        "import sys; sys.modules['matplotlib'] = None; from gateway.cli import main; "
        f"sys.exit(main(['bench', {stub_url!r}, '--model', 'stub', '--requests', '3', '--documents', '2', '--warmup', '0', "
        f"'--concurrency', '1', '--no-progress', '--out', {str(out)!r}]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    (s,) = json.loads((out / "bench.json").read_text())["summaries"]
    assert s["ok"] == 3
    assert (out / "report.md").is_file() and not list(out.glob("*.png"))
    skipped = [line for line in proc.stderr.splitlines() if "plots skipped" in line]
    assert len(skipped) == 1 and "matplotlib" in skipped[0] and "Traceback" not in proc.stderr


# Reports get shared: no secret given to bench may reach stdout, stderr or any file it writes.
_KEY = "rk-BenchKeyMustNotLeak0123456789abcdefghij"
_SECRETS = {
    "key": _KEY,
    "compare key": "cmp-key-must-not-leak-42",
    "header": "hdr-token-must-not-leak-7",
    "url password": "url-pass-must-not-leak",
    "url query": "qs-token-must-not-leak",
}


def _assert_no_secret(texts: dict[str, bytes]) -> None:
    for where, data in texts.items():
        for what, secret in _SECRETS.items():
            assert secret.encode() not in data, f"{what} written to {where}"


@pytest.mark.slow
def test_no_output_carries_a_key(gateway_server, stub_url: str, tmp_path: Path) -> None:
    server = gateway_server(STATIC, env={"RERANK_API_KEY": _KEY})
    out = tmp_path / "keyed"
    port = stub_url.rsplit(":", 1)[1]
    compare = f"http://bench:{_SECRETS['url password']}@127.0.0.1:{port}/v2/rerank?api_key={_SECRETS['url query']}"
    proc = bench(
        server.url,
        "--model",
        "static",
        "--api-key",
        _KEY,
        "--compare",
        compare,
        f"--compare-api-key={_SECRETS['compare key']}",
        "--head",
        f"X-Upstream-Token: {_SECRETS['header']}",
        "--requests",
        "4",
        "--concurrency",
        "2",
        "--documents",
        "3",
        "--warmup",
        "0",
        "--out",
        str(out),
    )
    # Every request answered: the gateway only does with the key, so it was sent.
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "bench.json").read_text())
    assert [s["ok"] for s in doc["summaries"]] == [4, 4]
    files = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {"bench.json", "report.md", "latency_cdf.png"} <= set(files)
    _assert_no_secret({"stdout": proc.stdout.encode(), "stderr": proc.stderr.encode(), **files})
    assert doc["summaries"][1]["endpoint"] == f"127.0.0.1:{port}"  # no user info in the label
    assert "--api-key '<redacted>'" in doc["command"] and "X-Upstream-Token: <redacted>" in doc["command"]


def test_key_in_an_error_message_is_redacted(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(_KEY + "\n")
    proc = bench(
        f"ftp://u:{_SECRETS['url password']}@host/{_KEY}", "--api-key-file", str(key_file), "--out", str(tmp_path / "x")
    )
    assert proc.returncode == 2 and "not an http(s) URL" in proc.stderr and "<redacted>" in proc.stderr
    _assert_no_secret({"stdout": proc.stdout.encode(), "stderr": proc.stderr.encode()})


def test_command_line_redaction_covers_every_spelling() -> None:
    from gateway.bench.redact import Redactor

    r = Redactor(
        keys=("ab", "rk-long-key-1234"),
        headers=["Authorization: Bearer tok-5678"],
        urls=["https://user:pw-9999@h/x?access_token=qs-0000&n=3"],
    )
    argv = [
        "https://user:pw-9999@h/x?access_token=qs-0000&n=3",
        "--api-k",
        "ab",
        "--compare-api-key=rk-long-key-1234",
        "--header",
        "Authorization: Bearer tok-5678",
        "--requests",
        "3",
    ]
    assert r.argv(argv) == [
        "https://h/x?access_token=<redacted>&n=3",
        "--api-k",
        "<redacted>",
        "--compare-api-key=<redacted>",
        "--header",
        "Authorization: <redacted>",
        "--requests",
        "3",
    ]
    assert r.scrub("sent Bearer tok-5678 to rk-long-key-1234") == "sent <redacted> to <redacted>"
