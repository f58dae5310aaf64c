"""Memory over hostile input: two identical fuzz passes, the RSS before and after each.

The reliability suite's ``fuzz`` section (``python -m benchmarks.reliability --only fuzz``). One
gateway process (``static`` engine, an API key with per-key limits in Redis when
``redis-server`` is installed, small body limits) takes a warm-up of valid requests, then the same
list of requests twice: schemathesis' positive and negative cases for every operation of the
app's own OpenAPI (derandomized, so the list is the same on every run), each checked with every
schemathesis check (``positive_data_acceptance`` included), and every request of
:mod:`benchmarks.reliability.hostile`.

The gateway's RSS is read after the warm-up and after each pass. A second pass that adds memory
is growth without bound (each pass would add as much); a first pass that adds memory and a
second that does not is one-time growth (caches filled, allocator arenas grown). The bound the
report checks: the second pass adds less than :data:`SECOND_PASS_BOUND` of the RSS.

The tracemalloc'd twin of the gateway (where the Python heap grew: hardly, the growth was
glibc keeping freed large bodies, docs/reliability/README.md) was removed on 2026-12-05; it last
existed at commit 7554a0c.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.reliability.hostile import hostile_pass

__all__ = ("SECOND_PASS_BOUND", "build_cases", "fuzz_memory", "unequal_score_pairs")

# The second identical pass may add less than this share of the RSS it starts from.
SECOND_PASS_BOUND = 0.05
KEY = "rk-reliability-fuzz-memory-0123456789abcdef"
MAX_BODY = 1_000_000
MAX_DOCUMENTS = 10_000
BODY_TIMEOUT_S = 2.0


def unequal_score_pairs(body: object) -> bool:
    """vLLM's N:N rule (as many first-side texts as second-side ones) that JSON Schema cannot state."""
    if not isinstance(body, dict):
        return False
    for first, second in (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
        a, b = body.get(first), body.get(second)
        if isinstance(a, list) and len(a) > 1 and len(a) != (len(b) if isinstance(b, list) else 1):
            return True
    return False


def out_of_scope(case: Any) -> str | None:
    """Why a schemathesis case is not a conformance check of the gateway (None: it is)."""
    if isinstance(case.body, dict) and any(isinstance(v, list) and len(v) > MAX_DOCUMENTS for v in case.body.values()):
        return "over limits.max_documents: the documented 413"
    if case.path in ("/score", "/v1/score") and unequal_score_pairs(case.body):
        return "unequal N:M score lists: vLLM's 400, stated only in words"
    return None


def config(redis_url: str | None) -> str:
    from gateway.security.auth import hash_key

    limits = f'redis_url = "{redis_url}"\n' if redis_url else ""
    return (
        f"[server]\nbody_read_timeout_s = {BODY_TIMEOUT_S}\n\n[limits]\nmax_body_bytes = {MAX_BODY}\n"
        f'max_documents = {MAX_DOCUMENTS}\n{limits}\n[logging]\nformat = "json"\nlevel = "WARNING"\n\n'
        f'[[auth.keys]]\nid = "fuzz"\nhash = "{hash_key(KEY)}"\nmodels = ["*"]\nrpm = 1000000\ntpm = 1000000000\n\n'
        '[[models]]\nname = "static"\nengine = "static"\naliases = ["rerank-v3.5"]\n'
    )


def build_cases(openapi: dict[str, Any], per_operation: int) -> list[Any]:
    """schemathesis' positive and negative cases for every operation, the same list on every run."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_dict(openapi)
    cases: list[Any] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=per_operation,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(operation.as_strategy(generation_mode=mode))
            def draw(case: Any) -> None:
                cases.append(case)

            try:
                draw()
            except Unsatisfiable:  # nothing to break: a negative case of a GET without parameters
                pass
    return cases


def fuzz_pass(url: str, port: int, cases: list[Any]) -> dict[str, Any]:
    """Every case once, checked; then every hostile request. Failures counted by check."""
    import requests
    from schemathesis.core.failures import FailureGroup

    failures: Counter[str] = Counter()
    examples: dict[str, str] = {}
    statuses: Counter[str] = Counter()
    skipped = 0
    session = requests.Session()
    start = time.monotonic()
    for case in cases:
        if out_of_scope(case):
            skipped += 1
            continue
        try:
            resp = case.call_and_validate(base_url=url, session=session, headers={"Authorization": f"Bearer {KEY}"})
            statuses[str(resp.status_code)] += 1
        except (Exception, FailureGroup) as exc:  # a group of failed checks (a BaseExceptionGroup)  # noqa: BLE001
            for failure in getattr(exc, "exceptions", [exc]):
                name = type(failure).__name__
                failures[name] += 1
                examples.setdefault(name, f"{case.method} {case.path}: {str(failure)[:300]}")
    hostile = hostile_pass(
        port, key=KEY, max_body_bytes=MAX_BODY, max_documents=MAX_DOCUMENTS, timeout=BODY_TIMEOUT_S + 20
    )
    return {
        "schemathesis_cases": len(cases) - skipped,
        "out_of_scope": skipped,
        "statuses": dict(sorted(statuses.items())),
        "check_failures": sum(failures.values()),
        "failures_by_check": dict(failures),
        "failure_examples": examples,
        "hostile_requests": hostile["tried"],
        "hostile_5xx": hostile["five_xx"],
        "seconds": round(time.monotonic() - start, 1),
    }


def warm_up(url: str, n: int) -> None:
    with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as http:
        for i in range(n):
            body = {"model": "static", "query": f"query {i}", "documents": [f"doc {i}-{j}" for j in range(1 + i % 50)]}
            http.post(("/v2/rerank", "/v1/rerank", "/rerank")[i % 3], json=body).raise_for_status()


def fuzz_memory(workdir: Path, gateway_cls: Any, redis: Any, per_operation: int, warmup: int = 600) -> dict[str, Any]:
    """The warm-up and both passes against one gateway process, its RSS after each; see the module docstring."""
    from gateway.app import create_app
    from gateway.config.settings import load_settings

    redis_url = f"redis://127.0.0.1:{redis.port}/0" if redis is not None else None
    text = config(redis_url)
    (workdir / "fuzz-schema.toml").write_text(text)
    settings = load_settings(workdir / "fuzz-schema.toml", environ={})
    openapi = json.loads(
        json.dumps(create_app(settings, configure_logs=False).plugins.get("OpenAPIPlugin").provide_openapi_schema())
    )
    t0 = time.monotonic()
    cases = build_cases(openapi, per_operation)
    report: dict[str, Any] = {
        "redis": redis_url is not None,
        "warmup_requests": warmup,
        "examples_per_operation_and_mode": per_operation,
        "cases_generated": len(cases),
        "generation_s": round(time.monotonic() - t0, 1),
        "bound_second_pass": SECOND_PASS_BOUND,
    }

    gw = gateway_cls(text, workdir, "fuzz").ready()
    try:
        warm_up(gw.url, warmup)
        time.sleep(1)
        rss = {"after_warmup": gw.rss_mb()}
        passes = []
        for n in (1, 2):
            passes.append(fuzz_pass(gw.url, gw.port, cases))
            time.sleep(1)
            rss[f"after_pass_{n}"] = gw.rss_mb()
        report["passes"] = passes
        report["rss_mb"] = {k: round(v, 1) for k, v in rss.items()}
        first = rss["after_pass_1"] - rss["after_warmup"]
        second = rss["after_pass_2"] - rss["after_pass_1"]
        report["pass_1_growth_pct"] = round(100 * first / rss["after_warmup"], 1)
        report["pass_2_growth_pct"] = round(100 * second / rss["after_pass_1"], 1)
        report["second_pass_within_bound"] = second < SECOND_PASS_BOUND * rss["after_pass_1"]
        report["server_5xx_counted"] = sum(v for k, v in gw.statuses().items() if k.startswith("5"))
        report["tracebacks_logged"] = gw.tracebacks()
    finally:
        gw.stop()

    return report
