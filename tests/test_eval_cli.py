"""``rerank-gateway eval`` end to end against real gateway processes on loopback.

- Static models whose scores are set per document (an oracle and its reverse) on a hand-made
  BEIR directory: the reported nDCG@10 / MRR@10 are the hand-computed values and ranx's own
  ``evaluate`` of the same orders; the report holds every system, the per-query figures, the
  paired tests and the plot.
- Bad input is one line and a non-zero exit, never a traceback: a qrels naming a document the
  corpus lacks, an empty judged query, a model the key may not use, a gateway nobody answers on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from math import log2
from pathlib import Path

import pytest

from gateway.cli import main
from tests.conftest import ServerProcess, free_port

pytest.importorskip("ranx")
pytest.importorskip("bm25s")

KEY = "rk-eval-test-key-0123456789"
DOCS = {"a": "bread oven bake", "b": "bread shop", "c": "bread price", "x": "mountain peak", "y": "mountain road"}
ORACLE = {"a": 0.9, "b": 0.8, "x": 0.7, "c": 0.2, "y": 0.1}
REVERSE = {"a": 0.1, "b": 0.2, "x": 0.3, "c": 0.8, "y": 0.9}
QRELS = {"q1": {"a": 2, "b": 1, "c": 0}, "q2": {"x": 1}}
# By hand (trec_eval's nDCG: gain = grade, discount log2(rank + 1)), every document a candidate:
# oracle:  q1 a b x c y -> DCG = IDCG -> 1;     q2 a b x -> x at 3: 1/log2(4) = 0.5
# reverse: q1 y c x b a -> (1/log2(5) + 2/log2(6)) / (2 + 1/log2(3)) = 0.45778; q2 y c x -> 0.5
HAND = {
    "oracle": {"ndcg@10": (1.0 + 0.5) / 2, "mrr@10": (1 + 1 / 3) / 2},
    "reverse": {"ndcg@10": ((1 / log2(5) + 2 / log2(6)) / (2 + 1 / log2(3)) + 0.5) / 2, "mrr@10": (1 / 4 + 1 / 3) / 2},
}


def _beir(root: Path, *, qrels: str | None = None, queries: dict[str, str] | None = None) -> Path:
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in DOCS.items()))
    queries = queries or {"q1": "bake bread", "q2": "mountain peak"}
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items()))
    lines = qrels or "".join(f"{q}\t{d}\t{g}\n" for q, docs in QRELS.items() for d, g in docs.items())
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + lines)
    return root


def _static(name: str, scores: dict[str, float]) -> str:
    table = ", ".join(f"{json.dumps(DOCS[d])} = {s}" for d, s in scores.items())
    return f'[[models]]\nname = "{name}"\nengine = "static"\nscore = 0.0\nscores = {{{table}}}\n'


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    config = (
        _static("oracle", ORACLE)
        + _static("reverse", REVERSE)
        + f'[[auth.keys]]\nid = "all"\nhash = "sha256:{digest}"\nmodels = ["oracle", "reverse"]\n'
        + '[[auth.keys]]\nid = "oracle-only"\nhash = "sha256:'
        + hashlib.sha256(b"rk-oracle-only-0123456789").hexdigest()
        + '"\nmodels = ["oracle"]\n'
    )
    srv = ServerProcess(config, tmp_path_factory.mktemp("eval-gw"))
    try:
        srv.wait_ready(timeout=60)
        yield srv
    finally:
        srv.stop()


def _eval(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["eval", *argv, "--no-progress"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_eval_reports_hand_computed_metrics_per_model(
    gateway: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ranx import Qrels, Run, evaluate

    data, out = _beir(tmp_path / "beir"), tmp_path / "out"
    code, stdout, err = _eval(
        capsys,
        gateway.url,
        str(data),
        "--model",
        "oracle,reverse",
        "--api-key",
        KEY,
        "--depth",
        "5",
        "--recall-at",
        "1,5",
        "--out",
        str(out),
    )
    assert code == 0, err
    doc = json.loads((out / "eval.json").read_text())
    means = doc["quality"]["mean"]
    assert list(means) == ["first stage", "oracle", "reverse"]
    for model, figures in HAND.items():
        for metric, value in figures.items():
            assert means[model][metric] == pytest.approx(value, abs=1e-12), (model, metric)
    # The library's own evaluation of the orders the models answered (from the per-query report).
    per_query = doc["per_query"]
    for model, scores in (("oracle", ORACLE), ("reverse", REVERSE)):
        run = Run({q: {d: scores[d] for d in DOCS} for q in QRELS})
        own = evaluate(Qrels(QRELS), run, ["ndcg@10", "mrr@10", "recall@1"])
        for metric, value in own.items():
            assert means[model][metric] == pytest.approx(value, abs=1e-9)
            assert sum(per_query[q][model][metric] for q in QRELS) / 2 == pytest.approx(value, abs=1e-9)
    assert all(per_query[q][m]["latency_ms"] > 0 for q in QRELS for m in ("oracle", "reverse"))
    pairs = {(t["a"], t["b"]) for t in doc["quality"]["tests"] if t["metric"] == "ndcg@10"}
    assert pairs == {("first stage", "oracle"), ("first stage", "reverse"), ("oracle", "reverse")}
    assert doc["speed"]["oracle"]["requests"] == 2 and doc["speed"]["oracle"]["docs_per_s"] > 0
    assert "| oracle | 0.7500 | 0.6667 |" in (out / "report.md").read_text()
    assert (out / "quality_speed.png").stat().st_size > 0
    assert KEY not in (out / "eval.json").read_text() + stdout + err  # redacted in the command line
    assert doc["command"].startswith(
        f"rerank-gateway eval {gateway.url} {data} --model oracle,reverse --api-key '<redacted>'"
    )


def test_bad_judgements_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unknown = _beir(tmp_path / "unknown", qrels="q1\ta\t2\nq1\tzz\t1\n")
    code, _, err = _eval(capsys, "http://127.0.0.1:9", str(unknown), "--model", "m")
    assert code == 2
    assert err.strip().splitlines() == [
        (f"rerank-gateway eval: {unknown}/qrels/test.tsv:3: document 'zz' is not in corpus.jsonl")
    ]
    empty = _beir(tmp_path / "empty", queries={"q1": "bake bread", "q2": "   "})
    code, _, err = _eval(capsys, "http://127.0.0.1:9", str(empty), "--model", "m")
    assert code == 2
    assert err.strip().splitlines() == [
        (f"rerank-gateway eval: {empty}/queries.jsonl:2: query 'q2' is empty (it is judged in test.tsv)")
    ]


def test_refusals_of_the_gateway_are_one_line(
    gateway: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _beir(tmp_path / "beir")
    code, _, err = _eval(
        capsys,
        gateway.url,
        str(data),
        "--model",
        "oracle,reverse",
        "--api-key",
        "rk-oracle-only-0123456789",
        "--out",
        str(tmp_path / "o1"),
    )
    assert code == 1
    [line] = err.strip().splitlines()
    assert line.startswith("rerank-gateway eval: model 'reverse', query 'q1': HTTP 403: ") and "Traceback" not in err
    assert "rk-oracle-only-0123456789" not in err
    code, _, err = _eval(
        capsys, f"http://127.0.0.1:{free_port()}", str(data), "--model", "oracle", "--out", str(tmp_path / "o2")
    )
    assert code == 1
    [line] = err.strip().splitlines()
    assert line.startswith("rerank-gateway eval: cannot reach http://127.0.0.1:") and "ConnectError" in line


def test_models_are_interleaved_query_by_query_in_rotating_order() -> None:
    """The driver's order (gateway/eval/driver.py): warm-up queries first, then each query to every
    model, the first model rotating, so a machine that slows down mid-run costs every model alike."""
    import asyncio
    from http.server import BaseHTTPRequestHandler

    from gateway.eval.driver import Query, run_models
    from tests.loopback import LoopbackServer

    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append((body["model"], body["query"]))
            reply = json.dumps(
                {"results": [{"index": i, "relevance_score": 0.5} for i in range(len(body["documents"]))]}
            )
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = LoopbackServer(Handler)
    try:
        queries = [Query(qid=f"q{i}", text=f"t{i}", doc_ids=["a", "b"], texts=["x", "y"]) for i in range(3)]
        answers = asyncio.run(run_models(server.url + "/v2/rerank", {}, ["a", "b", "c"], queries, timeout=10, warmup=1))
    finally:
        server.close()
    assert seen == [
        ("a", "t0"),
        ("b", "t0"),
        ("c", "t0"),  # warm-up, unmeasured
        ("a", "t0"),
        ("b", "t0"),
        ("c", "t0"),
        ("b", "t1"),
        ("c", "t1"),
        ("a", "t1"),
        ("c", "t2"),
        ("a", "t2"),
        ("b", "t2"),
    ]
    assert {m: [a.qid for a in answers[m]] for m in answers} == {m: ["q0", "q1", "q2"] for m in "abc"}


def test_trec_files_and_a_run_file_give_the_candidates(
    gateway: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    beir = _beir(tmp_path / "beir")
    qrels = tmp_path / "qrels.trec"
    qrels.write_text("".join(f"{q} 0 {d} {g}\n" for q, docs in QRELS.items() for d, g in docs.items()))
    run = tmp_path / "bm25.run"
    run.write_text("q1 Q0 c 1 3.0 t\nq1 Q0 a 2 2.0 t\nq1 Q0 b 3 1.0 t\nq2 Q0 y 1 2.0 t\nq2 Q0 x 2 1.0 t\n")
    out = tmp_path / "out"
    code, _, err = _eval(
        capsys,
        gateway.url,
        "--corpus",
        str(beir / "corpus.jsonl"),
        "--queries",
        str(beir / "queries.jsonl"),
        "--qrels",
        str(qrels),
        "--run",
        str(run),
        "--model",
        "oracle",
        "--api-key",
        KEY,
        "--no-plot",
        "--out",
        str(out),
    )
    assert code == 0, err
    doc = json.loads((out / "eval.json").read_text())
    assert doc["data"]["first_stage"] == "run file bm25.run"
    first = doc["quality"]["mean"]["first stage"]["ndcg@10"]
    # The run's order: q1 c a b, q2 y x. The oracle reorders only those candidates: a b c, x y.
    q1 = (2 / log2(3) + 1 / log2(4)) / (2 + 1 / log2(3))
    assert first == pytest.approx((q1 + 1 / log2(3)) / 2, abs=1e-12)
    assert doc["quality"]["mean"]["oracle"]["ndcg@10"] == pytest.approx(1.0, abs=1e-12)
    assert doc["speed"]["oracle"]["documents"] == 5  # three and two candidates, not the corpus
    run.write_text("q1 Q0 nope 1 3.0 t\n")
    code, _, err = _eval(capsys, gateway.url, str(beir), "--run", str(run), "--model", "oracle", "--api-key", KEY)
    assert code == 2 and err.strip() == f"rerank-gateway eval: {run}:1: document 'nope' is not in the corpus"
