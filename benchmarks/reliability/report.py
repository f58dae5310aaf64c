"""The reliability run's report: reliability.json (merged with a same-day run) and reliability.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.reliability.sections import SECTIONS


def _md(report: dict[str, Any]) -> str:
    lines = [
        f"# Reliability run {report['date']}",
        "",
        f"Machine: {report['machine']}. Command: `{report['command']}`.",
        "",
    ]
    if ran := report.get("section_dates"):
        lines += [
            "Sections re-run later (the others ran at the time above): "
            + ", ".join(f"{k} {v}" for k, v in ran.items())
            + ".",
            "",
        ]
    lines += ["| Section | Figure | Value |", "|---|---|---|"]

    def row(section: str, figure: str, value: Any) -> None:
        lines.append(f"| {section} | {figure} | {value} |")

    if (f := report.get("fuzz")) and "passes" in f:
        p1, p2 = f["passes"]
        row(
            "fuzz",
            "schemathesis cases per pass (out of scope) / check failures pass 1, 2",
            f"{p1['schemathesis_cases']} ({p1['out_of_scope']}) / {p1['check_failures']}, {p2['check_failures']}",
        )
        row(
            "fuzz",
            "hostile requests per pass / 5xx pass 1, 2",
            f"{p1['hostile_requests']} / {p1['hostile_5xx']}, {p2['hostile_5xx']}",
        )
        r = f["rss_mb"]
        row(
            "fuzz",
            "RSS MB after warm-up / pass 1 / pass 2",
            f"{r['after_warmup']} / {r['after_pass_1']} (+{f['pass_1_growth_pct']} %) / {r['after_pass_2']} (+{f['pass_2_growth_pct']} %)",
        )
        row("fuzz", f"second pass adds < {f['bound_second_pass']:.0%}", f["second_pass_within_bound"])
        if h := f.get("heap"):
            row(
                "fuzz",
                "traced Python heap MB (warm / pass 1 / pass 2)",
                " / ".join(str(v) for v in h["traced_mb"].values()),
            )
            for phase in ("warm->pass1", "pass1->pass2"):
                top = ", ".join(f"{d['where']} {d['kb']:+} kB" for d in h.get(phase, [])[:4])
                row("fuzz", f"heap growth {phase}, largest lines", top)
        row(
            "fuzz",
            "5xx counted by the server, tracebacks logged",
            f"{f['server_5xx_counted']}, {f['tracebacks_logged']}",
        )
    elif f:
        row("fuzz", "skipped", f.get("skipped"))
    if s := report.get("soak"):
        row("soak", "clients x minutes", f"{s['clients']} x {s['seconds'] / 60:.1f} = {s['client_minutes']}")
        row(
            "soak",
            "requests tried / 5xx / errors / lost",
            f"{s['requests']} / {s['five_xx']} / {s['errors']} / {s['lost']}",
        )
        row("soak", "req/s, p50 / p99 ms", f"{s['req_per_s']}, {s['p50_ms']} / {s['p99_ms']}")
        row("soak", "RSS MB start / end / max", f"{s['rss_mb_start']} / {s['rss_mb_end']} / {s['rss_mb_max']}")
        for tag in ("hostile_before", "hostile_after"):
            h = s[tag]
            row(
                "hostile",
                f"{tag}: tried / 5xx / 4xx without JSON body / healthy after",
                f"{h['tried']} / {h['five_xx']} / {h['four_xx_without_json_body']} / {h['healthy_after']}",
            )
        row(
            "soak",
            "5xx counted by the server, tracebacks logged",
            f"{s['server_5xx_counted']}, {s['tracebacks_logged']}",
        )
    if u := report.get("upstream"):
        for phase in ("before_kill", "replica_killed", "replica_slow"):
            p = u[phase]
            row(
                "upstream",
                f"{phase}: requests / errors / lost / p99 ms",
                f"{p['requests']} / {p['errors']} / {p['lost']} / {p['p99_ms']}",
            )
        row("upstream", "recovery after the kill (s to first 200)", u["recovery_s_after_kill"])
    if (fo := report.get("failover")) and "healthy" in fo:
        for phase in ("healthy", "first_second_after_kill", "primary_dead", "after_restart"):
            p = fo[phase]
            row(
                "failover",
                f"{phase}: requests / errors / p50 / p99 ms / served by",
                f"{p['requests']} / {p['errors']} / {p['p50_ms']} / {p['p99_ms']} / {p['served_by']}",
            )
        row(
            "failover",
            f"primary preferred again (s after it is back; cooldown_s {fo['cooldown_s']:g}): first answer / "
            "first second all its own",
            f"{fo['preferred_again_s']} / {fo['all_primary_again_s']}",
        )
    elif fo:
        row("failover", "skipped", fo.get("skipped"))
    if r := report.get("redis"):
        for mode, m in r.items():
            d = m["redis_down"]
            row(
                "redis",
                f"{mode}: while down: requests / statuses / Retry-After on every 503",
                f"{d['requests']} / {d['statuses']} / {d['retry_after_on_all_503']}",
            )
            row("redis", f"{mode}: recovery (s)", m["recovery_s_after_restart"])
            row(
                "redis",
                f"{mode}: after restart: errors / lost",
                f"{m['after_restart']['errors']} / {m['after_restart']['lost']}",
            )
    if t := report.get("sigterm"):
        row(
            "sigterm",
            "in flight / answered 200 / exit s / exit code",
            f"{t['in_flight']} / {t['answered_200']} / {t['exit_s']} / {t['exit_code']}",
        )
    if e := report.get("engine"):
        if "skipped" in e:
            row("engine", "skipped", e["skipped"])
        else:
            a = e.get("until_recovery") or e["after_kill"]
            row(
                "engine",
                "kill to recovery: requests / statuses / lost / Retry-After on every 503",
                f"{a['requests']} / {a['statuses']} / {a['lost']} / {a['retry_after_on_all_503']}",
            )
            row("engine", "recovery (s from kill to first 200)", e["recovery_s_after_kill"])
            if "window_s" in e:
                row("engine", "window (s) / first start of the engine (s)", f"{e['window_s']:g} / {e['first_start_s']}")
                restarts = [ev for ev in e["gateway_events"] if ev["event"] == "engine_restarted"]
                failed = [ev for ev in e["gateway_events"] if ev["event"] == "engine_restart_failed"]
                row(
                    "engine",
                    "restart: engine start s / failed attempts",
                    f"{restarts[0]['load_s'] if restarts else None} / {len(failed)}",
                )
            if r := e.get("after_recovery"):
                row(
                    "engine",
                    "after recovery: requests / statuses / lost",
                    f"{r['requests']} / {r['statuses']} / {r['lost']}",
                )
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
