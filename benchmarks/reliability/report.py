"""The reliability run's report: reliability.json (merged with a same-day run) and reliability.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.harness import table
from benchmarks.reliability.sections import SECTIONS


def _j(*values: Any) -> str:
    return " / ".join(str(v) for v in values)


def _rows(report: dict[str, Any]) -> list[list[Any]]:
    """(section, figure, value) for every section the report holds."""
    rows: list[list[Any]] = []
    if s := report.get("soak"):
        rows.append(["soak", "clients x minutes", f"{s['clients']} x {s['seconds'] / 60:.1f} = {s['client_minutes']}"])
        rows.append(
            ["soak", "requests tried / 5xx / errors / lost", _j(s["requests"], s["five_xx"], s["errors"], s["lost"])]
        )
        rows.append(["soak", "req/s, p50 / p99 ms", f"{s['req_per_s']}, {s['p50_ms']} / {s['p99_ms']}"])
        rows.append(["soak", "RSS MB start / end / max", _j(s["rss_mb_start"], s["rss_mb_end"], s["rss_mb_max"])])
        for tag in ("hostile_before", "hostile_after"):
            h = s[tag]
            figure = f"{tag}: tried / 5xx / 4xx without JSON body / healthy after"
            rows.append(
                ["hostile", figure, _j(h["tried"], h["five_xx"], h["four_xx_without_json_body"], h["healthy_after"])]
            )
        rows.append(
            [
                "soak",
                "5xx counted by the server, tracebacks logged",
                f"{s['server_5xx_counted']}, {s['tracebacks_logged']}",
            ]
        )
    if u := report.get("upstream"):
        for phase in ("before_kill", "replica_killed", "replica_slow"):
            p = u[phase]
            rows.append(
                [
                    "upstream",
                    f"{phase}: requests / errors / lost / p99 ms",
                    _j(p["requests"], p["errors"], p["lost"], p["p99_ms"]),
                ]
            )
        rows.append(["upstream", "recovery after the kill (s to first 200)", u["recovery_s_after_kill"]])
    if (fo := report.get("failover")) and "healthy" in fo:
        for phase in ("healthy", "first_second_after_kill", "primary_dead", "after_restart"):
            p = fo[phase]
            figure = f"{phase}: requests / errors / p50 / p99 ms / served by"
            rows.append(["failover", figure, _j(p["requests"], p["errors"], p["p50_ms"], p["p99_ms"], p["served_by"])])
        figure = f"primary preferred again (s after it is back; cooldown_s {fo['cooldown_s']:g}): first answer / first second all its own"
        rows.append(["failover", figure, _j(fo["preferred_again_s"], fo["all_primary_again_s"])])
    elif fo:
        rows.append(["failover", "skipped", fo.get("skipped")])
    for mode, m in (report.get("redis") or {}).items():
        d, a = m["redis_down"], m["after_restart"]
        figure = f"{mode}: while down: requests / statuses / Retry-After on every 503"
        rows.append(["redis", figure, _j(d["requests"], d["statuses"], d["retry_after_on_all_503"])])
        rows.append(["redis", f"{mode}: recovery (s)", m["recovery_s_after_restart"]])
        rows.append(["redis", f"{mode}: after restart: errors / lost", _j(a["errors"], a["lost"])])
    if t := report.get("sigterm"):
        figure = "in flight / answered 200 / exit s / exit code"
        rows.append(["sigterm", figure, _j(t["in_flight"], t["answered_200"], t["exit_s"], t["exit_code"])])
    if (e := report.get("engine")) and "skipped" in e:
        rows.append(["engine", "skipped", e["skipped"]])
    elif e:
        a = e.get("until_recovery") or e["after_kill"]
        figure = "kill to recovery: requests / statuses / lost / Retry-After on every 503"
        rows.append(["engine", figure, _j(a["requests"], a["statuses"], a["lost"], a["retry_after_on_all_503"])])
        rows.append(["engine", "recovery (s from kill to first 200)", e["recovery_s_after_kill"]])
        if "window_s" in e:
            rows.append(
                ["engine", "window (s) / first start of the engine (s)", f"{e['window_s']:g} / {e['first_start_s']}"]
            )
            restarts = [ev for ev in e["gateway_events"] if ev["event"] == "engine_restarted"]
            failed = [ev for ev in e["gateway_events"] if ev["event"] == "engine_restart_failed"]
            restart = _j(restarts[0]["load_s"] if restarts else None, len(failed))
            rows.append(["engine", "restart: engine start s / failed attempts", restart])
        if r := e.get("after_recovery"):
            rows.append(
                ["engine", "after recovery: requests / statuses / lost", _j(r["requests"], r["statuses"], r["lost"])]
            )
    return rows


def _md(report: dict[str, Any]) -> str:
    lines = [
        f"# Reliability run {report['date']}",
        "",
        f"Machine: {report['machine']}. Command: `{report['command']}`.",
        "",
    ]
    if ran := report.get("section_dates"):
        later = ", ".join(f"{k} {v}" for k, v in ran.items())
        lines += [f"Sections re-run later (the others ran at the time above): {later}.", ""]
    lines += table(["Section", "Figure", "Value"], _rows(report))
    lines += ["", "Full figures (per-phase statuses, RSS timeline) are in reliability.json.", ""]
    return "\n".join(lines)


def _write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "reliability.json"
    if previous.exists():  # sections run separately on one day (e.g. `--only engine`) add up
        merged = json.loads(previous.read_text())
        merged.update({k: v for k, v in report.items() if k in SECTIONS})
        merged["section_dates"] = {**merged.get("section_dates", {}), **report.get("section_dates", {})}
        merged["command"] = " ; ".join(dict.fromkeys([*merged.get("command", "").split(" ; "), report["command"]]))
        report = merged
    (out / "reliability.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "reliability.md").write_text(_md(report))
