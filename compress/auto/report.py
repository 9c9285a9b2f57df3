"""``compress auto``'s report: ``search.json`` (every number of the search), ``report.md`` and ``pareto.png``
(accuracy against measured latency), written beside the chosen model in ``OUT/search``.

:class:`ReportData` gathers what the search measured; :func:`report_data` makes ``search.json``'s dict of it (the
format on disk) and :func:`write_report` writes the three files from that dict.

Every model's accuracy is its ``score``: the task's dev metric, or with ``--embedding`` the embedding check the search
used (``search.json``'s ``score`` says which, in words; the tables head its column "score" then, "dev" otherwise).
A model with no latency prediction (the static student: no shape) shows "—" there."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from compress.auto.engine import Halving
from compress.auto.search import pareto_front
from compress.auto.state import Probe, SearchRun
from compress.auto.variants import skipped
from compress.core.formats.records import utc_now
from compress.core.formats.writes import atomic_path, write_json_atomic


@dataclass(frozen=True, kw_only=True)
class ReportData:
    """What ``search.json`` is made of, gathered once the final runs are measured."""

    run: SearchRun  # the teacher, the target (its name, its score's words, the options), the budgets, the trained entries
    probe: Probe  # the latency probe: its model's error, the teacher's timings, where it was reused from
    predicted: dict[str, dict]  # label -> its prediction ("variants" predicted to fit, "measurements")
    halving: Halving
    results: list[dict]  # the finalists as measured (and the second run's candidates)
    chosen: dict | None  # the result chosen, None when nothing met every budget
    started: float  # time.monotonic() when the search started


def report_data(data: ReportData) -> dict:
    """``search.json``'s content (its ``compared`` rows are added by the caller, measured in the same run)."""
    run, probe = data.run, data.probe
    cfg, target, at = run.cfg, run.target, run.at[0]
    return {
        "kind": "auto", "when": utc_now(), "task": target.name, "teacher": str(run.teacher_dir),
        "score": target.score_description, "score_column": target.score_column,
        "budgets": [b.text for b in run.budgets], "backends": list(cfg.backends), "point": list(at),
        "skipped_variants": skipped(cfg.variant_table, cfg.backends, run.teacher_dir),
        "seconds": round(time.monotonic() - data.started, 1), "latency_model_error": probe.error,
        "final_runs": cfg.final_runs, "probe_reused_from": probe.reused_from,
        "teacher_ms": probe.teacher, "teacher_probe_timings": probe.teacher_timings,
        "predicted": {k: {"variants": v["variants"]} for k, v in data.predicted.items()},
        "trained": list(run.search.state["trained"].values()), "halving_stopped": data.halving.stopped,
        "trials": list(data.halving.trials),
        "results": [{k: v for k, v in r.items() if k not in ("measurement", "predicted")}
                    | {"measured_p50_ms": r["measurement"]["points"][at]["p50_ms"],
                       "slowest_p50_ms": r["measurement"]["points"][at].get("slowest", {}).get("p50_ms"),
                       "predicted_p50_ms": r["predicted"]["points"][at]["p50_ms"] if r["predicted"] else None,
                       "size_bytes": r["measurement"]["size_bytes"]} for r in data.results],
        "chosen": None if data.chosen is None else {"name": data.chosen["name"], "dir": data.chosen["dir"],
                                                    "accuracy": data.chosen["accuracy"]},
    }


def _teacher_timings(report: dict, at: tuple[int, int]) -> str:
    """The teacher's p50 in the final runs (the reference of speed-up budgets) and in the probe, which may be an
    earlier search's."""
    timings = (report.get("teacher_probe_timings") or {}).get(f"{at[0]},{at[1]}")
    probe = f"{report['teacher_ms'].get(f'{at[0]},{at[1]}', float('nan')):.2f} ms in the latency probe" + (
        f" (the faster of {timings[0]:.2f} and {timings[1]:.2f})" if timings and timings[0] != timings[1] else "") + (
        " (an earlier search's)" if report.get("probe_reused_from") else "")
    final = (report.get("compared") or [None])[0]
    return (f"{final['measured_p50_ms']:.2f} ms in the final runs, " if final else "") + probe


def write_report(where: Path, report: dict) -> None:
    """``search.json``, ``report.md`` and ``pareto.png`` in ``where``, from :func:`report_data`'s dict."""
    where.mkdir(parents=True, exist_ok=True)
    write_json_atomic(where / "search.json", report)
    at = tuple(report["point"])
    lines = [f"# compress auto: {report['task']}, budget {'; '.join(report['budgets'])}", "",
             f"- teacher: {report['teacher']} (p50 at batch {at[0]}, seq {at[1]}, torch fp32: {_teacher_timings(report, at)})",
             f"- search time: {report['seconds'] / 60:.1f} min; successive halving stopped: {report['halving_stopped']}"]
    if report.get("score"):
        lines.append(f"- score: {report['score']}")
    err = report["latency_model_error"]
    if err:
        lines.append(f"- latency model error on held-out probe shapes: median {err['median']:.1f}%, worst {err['worst']:.1f}%")
    if report.get("probe_reused_from"):
        lines.append(f"- latency probe reused from the earlier search {report['probe_reused_from']} (same teacher, backends, points)")
    reasons: dict[str, list[str]] = {}
    for name, why in (report.get("skipped_variants") or {}).items():
        reasons.setdefault(why, []).append(name)
    lines += [f"- not made: {', '.join(names)} ({why})" for why, names in reasons.items()]
    chosen = report["chosen"]
    lines.append(f"- chosen: {chosen['name']} ({chosen['accuracy']:.2f})" if chosen else "- chosen: nothing met every budget")
    column = report.get("score_column", "dev")
    lines += ["", "## Candidates trained", "", f"| shape | round | epochs | {column} | teacher | seconds |",
              "|---|--:|--:|--:|--:|--:|"]
    for t in report["trained"]:
        spent = f"{t['seconds']:.0f}" + (" (an earlier search's)" if t.get("reused_from") else "")
        lines.append(f"| {t['label']} | {t['round']} | {t['epochs']} | {t['score']:.2f} | {t['teacher']:.2f} | {spent} |")
    lines += ["", "## Successive halving (one Optuna trial per candidate)", "",
              f"| trial | shape | state | rounds | {column} per round | worker |",
              "|--:|---|---|--:|---|---|"]
    for t in report.get("trials", []):
        state = t["state"] + (f" (retry of {t['retry_of']})" if t.get("retry_of") is not None else "") + (
            ", out of time" if t.get("stopped") == "time" else "")
        scores = ", ".join(f"{x:.2f}" for x in t["scores"]) or "—"
        lines.append(f"| {t['number']} | {t['label']} | {state} | {t['rounds']} | {scores} | {t.get('worker') or '—'} |")
    runs = report.get("final_runs", 1)
    lines += ["", f"## Finalists, measured in one run{f' repeated {runs} times (budgets judged on the slowest run)' if runs > 1 else ''}",
              "", f"| model | {column} | predicted p50 ms | measured p50 ms | slowest run p50 ms | size MB | "
              f"{' | '.join(report['budgets'])} |",
              "|---|--:|--:|--:|--:|--:|" + "---|" * len(report["budgets"])]
    for r in report["results"]:
        marks = " | ".join("met" if r["meets"][b] else "missed" for b in report["budgets"])
        slowest = "—" if r.get("slowest_p50_ms") is None else f"{r['slowest_p50_ms']:.2f}"
        predicted = "—" if r.get("predicted_p50_ms") is None else f"{r['predicted_p50_ms']:.2f}"
        name = r["name"] + (" (second run)" if r.get("second_run") else "")
        lines.append(f"| {name} | {r['accuracy']:.2f} | {predicted} | {r['measured_p50_ms']:.2f} | "
                     f"{slowest} | {r['size_bytes'] / 1e6:.1f} | {marks} |")
    if report.get("compared"):
        lines += ["", "## Beside the teacher and the given models (same run; never chosen)", "",
                  f"| model | {column} | measured p50 ms | size MB | {' | '.join(report['budgets'])} |",
                  "|---|--:|--:|--:|" + "---|" * len(report["budgets"])]
        for r in report["compared"]:
            marks = " | ".join("met" if r["meets"][b] else "missed" for b in report["budgets"])
            dev = "—" if r["accuracy"] is None else f"{r['accuracy']:.2f}"
            lines.append(f"| {r['name']} | {dev} | {r['measured_p50_ms']:.2f} | {r['size_bytes'] / 1e6:.1f} | {marks} |")
    _plot(where / "pareto.png", report)
    lines += ["", "![accuracy against measured latency](pareto.png)"]
    with atomic_path(where / "report.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _plot(path: Path, report: dict) -> None:
    """Accuracy against measured p50: every finalist, the Pareto front, the latency budget line, the choice marked."""
    # deferred: matplotlib is only needed for the picture
    import matplotlib

    matplotlib.use("Agg")
    # deferred (pyplot after the backend is chosen)
    import matplotlib.pyplot as plt

    rs = report["results"]
    if not rs:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    xs, ys = [r["measured_p50_ms"] for r in rs], [r["accuracy"] for r in rs]
    ax.scatter(xs, ys, color="0.6", label="finalists")
    front = sorted(pareto_front(list(zip(ys, xs))), key=lambda i: xs[i])
    ax.plot([xs[i] for i in front], [ys[i] for i in front], color="C0", label="Pareto front")
    for budget in report["budgets"]:
        m = re.match(r"\s*(p50|p90|p99|mean)\s*<=\s*([0-9.]+)\s*ms", budget.lower())
        if m:
            ax.axvline(float(m.group(2)), color="C3", linestyle="--", label=f"budget {budget}")
    for j, r in enumerate(c for c in report.get("compared", []) if c["accuracy"] is not None):
        ax.scatter([r["measured_p50_ms"]], [r["accuracy"]], marker="^", color="C1", label="teacher and given models" if j == 0 else None)
        ax.annotate(r["name"], (r["measured_p50_ms"], r["accuracy"]), fontsize=7, xytext=(4, 2), textcoords="offset points")
    if report["chosen"]:
        i = next(i for i, r in enumerate(rs) if r["name"] == report["chosen"]["name"])
        ax.scatter([xs[i]], [ys[i]], s=120, facecolors="none", edgecolors="C2", linewidths=2, label="chosen")
    ax.set_xlabel(f"measured p50 latency (ms), batch {report['point'][0]}, seq {report['point'][1]}")
    ax.set_ylabel("embedding score" if report.get("score_column") == "score" else "dev metric")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
