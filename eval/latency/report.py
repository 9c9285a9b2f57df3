"""The latency report: ``latency.md`` (the grid table, kernels, GEMM peaks, real inputs) and ``latency.json``.

``format_markdown(report)`` renders the report dict :func:`compress.eval.latency.runs.measure_latency`
returns (its rows :class:`~compress.eval.latency.row.Row` and :class:`~compress.eval.latency.row.RealRow` records)
as one Markdown document; ``report_record(report)`` is that dict as ``latency.json`` holds it (each row as its
``to_dict()``), and ``write_report(report, out_dir)`` writes both; ``summarize`` is what ``compress latency`` prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress.core.errors import CompressError
from compress.core.formats.writes import write_json_atomic, write_text_atomic
from compress.eval.latency.config import MIN_PASSES, REAL_SLICE_S, LatencyConfig
from compress.eval.latency.peak import PRECISIONS
from compress.eval.latency.row import RealRow, Row

REPORT_JSON = "latency.json"
REPORT_MD = "latency.md"

# A model at its floor is possible (the BERT-base shape reaches the fp32 peak on OpenVINO); one faster than this share
# of it (above 1/0.95 = 105% of the peak) is not: the peak run was slowed.
BELOW_FLOOR = 0.95


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def format_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: a header naming the machine and settings, the grid table, and the real-input table."""
    runs = report.get("repeat_runs") or 1
    ref = report.get("reference")
    extra = ([f"spread over {runs} runs", "worst-run speed-up"] if runs > 1 else []) + (
        ["vs best fp32 (worst run)", "vs PyTorch eager"] if ref else [])
    lines = [f"# Latency ({report['backend']})", "", *_header(report), "",
             TABLE_HEAD[0] + "".join(f" {cell} |" for cell in extra), TABLE_HEAD[1] + "--:|" * len(extra)]
    for r in report["rows"]:
        line = (
            f"| {r.name} | {r.batch} | {r.seq} | {r.p50_ms:.2f} | {r.p90_ms:.2f} | "
            f"{r.p99_ms:.2f} | {r.throughput:.1f} | {r.params / 1e6:.2f} | {r.size_mb:.1f} | "
            f"{r.gflops_per_seq:.4g} | {r.achieved_gflops:.1f} | {_fmt(r.pct_peak, '.0f')} | "
            f"{r.speedup:.2f}x | {r.precision or '?'} | {_fmt(r.x_floor, '.1f')} |"
        )
        if runs > 1:
            line += f" {r.spread_pct:.0f}% | {r.speedup_min:.2f}x |"
        if ref:
            torch_eager = r.speedup_vs_torch
            line += (f" {r.speedup_vs_best_fp32:.2f}x ({r.speedup_vs_best_fp32_min:.2f}x) |"
                     f" {_fmt(torch_eager, '.2f')}{'x' if torch_eager is not None else ''} |")
        lines.append(line)
    lines += kernel_lines(report["rows"], ref)
    if ref:
        lines += ["", f"Reference: {ref['model']} in fp32 on " + "; ".join(
            f"{b} " + ", ".join(f"{k} {v:.2f} ms" for k, v in points.items()) for b, points in ref["p50_ms"].items())
            + " (median p50 over runs); 'vs best fp32' divides its fastest backend's p50 by the row's."]
    if report.get("real_rows"):
        lines += ["", *format_real(report)]
    return "\n".join(lines) + "\n"


def kernel_lines(rows: list[Row], reference: dict[str, Any] | None = None) -> list[str]:
    """Under the table, one line per model and backend (the reference's too): what its matrix multiplications ran on.

    "inferred" marks a runtime that reports nothing (ONNX Runtime's MLAS, fbgemm): its kernels follow from the flags.
    """
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row.kernels:
            seen.setdefault((row.name, row.backend), row.kernels)
    for backend, kernels in ((reference or {}).get("kernels") or {}).items():
        if kernels and (reference["model"], backend) not in seen:  # the first model's own run on that backend: listed
            seen[reference["model"], f"reference {backend}"] = kernels
    if not seen:
        return []
    lines = ["", "Kernels (what each model's matrix multiplications ran on, as its library reports; ISA in brackets):", ""]
    for (name, backend), k in seen.items():
        isa = k.get("isa") or "ISA not reported"
        lines.append(f"- {name} ({backend}): {k['summary']} [{isa}{'' if k.get('reported') else ', inferred'}]"
                     + (f"; note: {k['note']}" if k.get("note") else ""))
    return lines


TABLE_HEAD = (
    "| model | batch | seq | p50 ms | p90 ms | p99 ms | seq/s | params (M) | size (MB) "
    "| GFLOPs/seq | GFLOP/s | % peak | speed-up vs first | precision | x floor |",
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|",
)


def format_real(report: dict[str, Any]) -> list[str]:
    """The real-input table: each model on the set's sentences at their own lengths."""
    info, ref = report["real_inputs"], report.get("reference")
    lines = [f"## Real inputs: {info['source']}", "",
             f"{info['n']} sentences, {info['mean_tokens']:.1f} tokens on average (median {info['median_tokens']:.0f}, "
             f"longest {info['max_tokens']}, {info['n_truncated']} cut at {info['max_length']}). Batch 1: one sentence at a "
             "time, in order (p50/p99 per sentence); larger batches: sorted by length, each padded to its longest "
             "(p50/p99 per batch). Speed-ups compare sentences per second.", "",
             "| model | backend | batch | p50 ms | p99 ms | sentences/s | speed-up vs first (worst run)"
             + (" | vs best fp32 (worst run) |" if ref else " |"),
             "|---|---|--:|--:|--:|--:|--:|" + ("--:|" if ref else "")]
    for r in report["real_rows"]:
        line = (f"| {r.name} | {r.backend} | {r.batch} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
                f"{r.sentences_per_s:.0f} | {r.speedup:.2f}x ({r.speedup_min:.2f}x) |")
        if ref:
            line += f" {r.speedup_vs_best_fp32:.2f}x ({r.speedup_vs_best_fp32_min:.2f}x) |"
        lines.append(line)
    return lines


def _header(report: dict[str, Any]) -> list[str]:
    """Bullet lines: machine, threads, versions, date, GEMM peak and how to read the table."""
    hw, cfg, packages = report["hardware"], report.get("config", {}), report["packages"]
    lines = [
        f"- CPU: {hw.get('cpu')} ({hw.get('arch')}{', ' + hw['generation'] if hw.get('generation') else ''}"
        f"{', ' + hw['core'] if hw.get('core') else ''}), "
        f"{hw.get('physical_cores')} physical / "
        f"{hw.get('logical_cores')} logical cores, {hw.get('usable_cores')} usable",
        f"- flags: {', '.join(hw.get('flags', [])) or 'none of interest'}",
        f"- threads: {report['threads']} intra-op, 1 inter-op; one process per model"
        + (f"; each point's passes in {cfg['bursts']} bursts, the models taking turns"
           + (f" (and on the real inputs, turns of {REAL_SLICE_S:g} s)" if cfg.get("lengths") else "")
           if (cfg.get("bursts") or 1) > 1 else ""),
        f"- torch {packages.get('torch', '?')}, transformers {packages.get('transformers', '?')}; {report['when']}",
        *peak_lines(report),
        f"- {cfg.get('warmup', '?')} warm-up + {cfg.get('repeats', '?')} timed passes per point, random token ids"
        + (f" (fewer, never below {MIN_PASSES}, where they passed {cfg['max_seconds']:g} s)" if cfg.get("max_seconds") else "")
        + (f", the whole measurement repeated {report['repeat_runs']} times (rows: median of the runs' medians)"
           if (report.get("repeat_runs") or 1) > 1 else "")
        + "; GFLOPs = encoder matmuls only; speed-up vs first = first model's p50 / this p50; % peak and x floor are "
        "against the measured peak of the precision the row's matrix multiplications ran in (x floor = p50 / "
        "(FLOPs / that peak))",
    ]
    lines.extend(f"- note: {note}" for note in report.get("notes") or ())
    if report.get("load_avg_1min") is not None:
        lines.append(f"- 1-minute load average before the run: {report['load_avg_1min']:.2f} on {hw.get('usable_cores')} cores")
    # Each row is against the peak of its own precision: clearly above it means that peak run was slowed.
    if any((r.pct_peak or 0) > 100 / BELOW_FLOOR for r in report["rows"]):
        lines.append(
            f"- note: some rows exceed the measured GEMM peak by more than {1 / BELOW_FLOOR - 1:.0%}, so the peak run was slowed "
            "(another busy process?); re-run on an idle machine"
        )
    return lines


def peak_lines(report: dict[str, Any]) -> list[str]:
    """The GEMM peaks: per precision, measured (best engine, every engine's figure) beside theoretical, and their ratio."""
    peaks, theory = report.get("peaks"), report.get("theoretical_peaks")
    if not peaks:
        return [f"- GEMM peak: {_fmt(report.get('peak_gflops'), '.1f')} GFLOP/s fp32"]
    lines = [f"- GEMM peaks (square n = {', '.join(map(str, peaks['sizes']))}; "
             f"theoretical: {(theory or {}).get('basis', 'not computed')}):", "",
             "  | precision | measured | best engine | every engine [kernels' ISA] | theoretical | measured / theoretical |",
             "  |---|--:|---|---|--:|--:|"]
    for precision in PRECISIONS:
        p = peaks[precision]
        engines = ", ".join(f"{name} {r['gflops']:.0f}{_isa(r.get('kernels'))}" if "gflops" in r else f"{name} n/a"
                            for name, r in p["engines"].items())
        bound = ((theory or {}).get(precision) or {}).get("gflops")
        ratio = f"{p['gflops'] / bound:.0%}" if bound and p["gflops"] else "n/a"
        lines.append(f"  | {precision} | {_fmt(p['gflops'], '.0f')} {p['unit']} | {p['best'] or 'no engine ran'} | "
                     f"{engines} | {_fmt(bound, '.0f')} | {ratio} |")
    lines.append("")
    lines.extend(f"- note: {note}" for note in report.get("peak_notes") or ())
    return lines


def _isa(kernels: dict[str, Any] | None) -> str:
    """`` [avx2]`` (`` [avx2, inferred]``) after an engine's figure: the ISA its kernels reported; empty when none."""
    if not kernels or not kernels.get("isa"):
        return ""
    return f" [{kernels['isa']}{'' if kernels.get('reported') else ', inferred'}]"


# The report's lists of records, and what each holds.
_RECORDS = {"rows": Row, "real_rows": RealRow}


def report_record(report: dict[str, Any]) -> dict[str, Any]:
    """The report as ``latency.json`` holds it: every row (and real-input row) as its ``to_dict()``."""
    return {k: [r.to_dict() for r in v] if k in _RECORDS else v for k, v in report.items()}


def read_report(record: dict[str, Any]) -> dict[str, Any]:
    """A report read back from ``latency.json`` (:func:`report_record`'s dict): its rows as records again."""
    return {k: [_RECORDS[k].from_dict(r) for r in v] if k in _RECORDS else v for k, v in record.items()}


def write_report(report: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``latency.json`` and ``latency.md`` into ``out_dir`` (each atomically); the directory."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CompressError(f"--out {out} exists and is not a directory; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / REPORT_JSON, report_record(report))
    write_text_atomic(out / REPORT_MD, format_markdown(report))
    return out


def summarize(report: dict[str, Any], cfg: LatencyConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress latency`` prints: the Markdown table, and where the files went with ``--out``."""
    notes = [f"wrote {cfg.out}/{REPORT_JSON} and {cfg.out}/{REPORT_MD}"] if cfg.out else []
    return format_markdown(report), notes
