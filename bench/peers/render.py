"""``bench.peers.run``'s report: ``peers.md`` from the run's result dict, and ``pareto.png`` (pure apart from the file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.peers.report import FP32_MIN_COSINE, REFINE_GAIN, RUNTIME_WITHIN, runtime_ratios

PACKAGES_SHOWN = ("torch", "transformers", "tokenizers", "sentence-transformers", "optimum", "optimum-onnx",
                  "optimum-intel", "onnxruntime", "openvino", "nncf", "ctranslate2", "model2vec", "numpy")


def _f(value, digits: int = 2, none: str = "—") -> str:
    return none if value is None else f"{value:,.{digits}f}"


def _verdict(met) -> str:
    return "not measured" if met is None else ("met" if met else "NOT met")


def precision_line(p: dict[str, Any]) -> str:
    """What the CPU's flags give (``compress.core.hardware.Precisions``), each said yes or no: absent is stated too."""
    said = {True: "yes", False: "no"}
    return (f"- native precisions (compress.core.hardware, from {p['source']}): int8 dot products (AVX512-VNNI or "
            f"AVX-VNNI) {said[p['vnni']]}, bf16 (AVX512_BF16 or AMX-BF16) {said[p['bf16']]}, AMX-BF16 "
            f"{said[p['amx_bf16']]}, AMX-INT8 {said[p['amx_int8']]}; ONNX Runtime's int8 preset {p['int8_preset']}")


def header_lines(h: dict[str, Any]) -> list[str]:
    d, cfg = h["data"], h["config"]
    tokens = d["timing_tokens"]
    lines = [
        f"- date: {h['date']}; CPU: {h['cpu']}, {h['cores']} usable cores, flags {', '.join(h['flags'])}; "
        f"{h['threads']} threads in every runtime; 1-minute load average {h['load_average']['before'][0]:.2f} before, "
        f"{h['load_average']['after'][0]:.2f} after; {h['minutes']['total']:.0f} minutes in all "
        f"({h['minutes']['build']:.0f} building)",
        f"- command: `{h['command']}`" + (f" — {h['note']}" if h.get("note") else ""),
    ]
    if h.get("precisions"):
        lines.insert(1, precision_line(h["precisions"]))
    for venv, env in h["environments"].items():
        packages = env["packages"]
        shown = ", ".join(f"{k} {packages[k]}" for k in PACKAGES_SHOWN if isinstance(packages, dict) and k in packages)
        lines.append(f"- environment `{venv}` ({env['python']}): {shown or packages}")
    lines += [
        f"- scored: STS-B dev, {d['stsb_pairs']:,} pairs (Spearman correlation x100 between the gold similarity and the "
        f"cosine of the pair's two embeddings); MRPC dev retrieval, each of {d['mrpc_queries']} paraphrase pairs' "
        f"sentence1 ranking all {d['mrpc_candidates']} distinct sentence2 by cosine (recall@1 and MRR x100). Each "
        f"contender embeds the {d['scored_sentences']:,} distinct sentences in its own process (batches of 64, longest "
        "first) and hands the embeddings back; every score is then computed by the same function, "
        "`bench.peers.report.score`, which follows `compress eval --embedding`'s definitions without calling the "
        "toolkit.",
        f"- timed: {d['timing_sentences']} distinct STS-B dev sentences (a seeded sample; {tokens['mean']:.1f} tokens on "
        f"average, median {tokens['median']:.0f}, longest {tokens['max']}), text in, normalised embedding out: batch 1 "
        f"is one call per sentence at its own length, batch 32 consecutive chunks of 32 in the sample's order; every "
        f"contender in its own process, loaded once, {cfg['warmup_passes']} untimed pass(es) per batch size, then "
        f"{cfg['rounds']} rounds in which each in turn (order rotated each round) is timed while the others wait; "
        "sentences/s is the median over rounds, ms the median batch-1 call.",
        f"- students: {cfg['distill_sentences']:,} distillation sentences, {cfg['epochs']} epoch(s) of {cfg['batch_size']} "
        f"at lr {cfg['lr']:g}; static refinement on at most {cfg['refine_sentences']:,} "
        + ("STS-B training sentences (the scored task's domain, labels unused)" if cfg.get("refine_on") == "stsb"
           else "of the user's sentences") + f"; the toolkit's static int8 "
        f"calibrated on {cfg['calibration_examples']} sentences, ST's OpenVINO static int8 on {cfg['ov_calibration_samples']} "
        "SST-2 training sentences (its default calibration set, read from a local copy: the hub is unreachable here). "
        "The user's sentences (distillation, refinement, toolkit calibration) are the shared corpora and the GLUE "
        "training files' sentences (no dev sentence), a seeded sample of them.",
    ]
    if h["reduced"]:
        lines.append("- settings other than the full run's defaults (a REDUCED run where smaller): " + ", ".join(
            f"{k} {v} (full: {h['full'][k]})" for k, v in h["reduced"].items()))
    return lines


def table(rows: list[dict[str, Any]], front: dict[str, list[str]]) -> list[str]:
    lines = ["| contender | side | precision | STS-B Spearman | MRPC R@1 | MRPC MRR | MB | b1 sent/s | b1 ms | b32 sent/s | front | "
             "cos to ST (mean / min) |", "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|--:|"]
    for r in rows:
        marks = "/".join(k for k in ("b1", "b32") if r["name"] in front.get(k, []))
        agree = r.get("agreement")
        cos = f"{agree['mean']:.4f} / {agree['min']:.4f}" if agree else "—"
        name = r["name"] if r["status"] == "ok" else f"{r['name']} (failed)"
        lines.append(f"| {name} | {r['side']} | {r['precision']} | {_f(r.get('spearman'))} | {_f(r.get('recall_at_1'))} | {_f(r.get('mrr'))} | "
                     f"{_f(r.get('mb'), 1)} | {_f(r.get('b1'), 0)} | {_f(r.get('b1_ms'), 2)} | {_f(r.get('b32'), 0)} | "
                     f"{marks} | {cos} |")
    return lines


def _at(verdict: dict[str, Any], speed: str) -> str:
    """One batch size's verdict: matched or not, by the fastest toolkit model of the class at least as accurate."""
    best = verdict[speed]
    if best["best"] is None:
        return f"{speed} NOT matched (no toolkit {verdict['class']} model as accurate)"
    return f"{speed} {'matched' if best['met'] else 'NOT matched'} (best as accurate: {best['best']}, {best['ratio']:.2f}x)"


def goal_lines(goal: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    by = {r["name"]: r for r in rows}
    peers = goal["peers"]
    lines = [f"**Every peer has a toolkit model of its precision class (int8 against int8, fp32 and fp16 against "
             f"fp32 and fp16) at least as accurate and at least as fast at batch 1 and batch 32: "
             f"{_verdict(peers['met'] if peers['each'] or peers['missing'] else None)}.**", ""]
    for v in peers["each"]:
        p = by[v["peer"]]
        text = (f"- {v['peer']} ({p['precision']}; {_f(p['spearman'])}, {_f(p['b1'], 0)} / {_f(p['b32'], 0)} sent/s): "
                f"{_at(v, 'b1')}; {_at(v, 'b32')}; ")
        if v["met"]:
            t = by[v["by"][0]]
            text += (f"matched at both by {', '.join(v['by'][:3])}{' ...' if len(v['by']) > 3 else ''} (best: {t['name']} "
                     f"{_f(t['spearman'])}, {t['b1'] / p['b1']:.2f}x b1, {t['b32'] / p['b32']:.2f}x b32)")
        else:
            parts = []
            if "as_accurate" in v:
                a = v["as_accurate"]
                parts.append(f"the fastest toolkit model at least as accurate, {a['name']}, runs {a['b1_ratio']:.2f}x its "
                             f"speed at b1 and {a['b32_ratio']:.2f}x at b32")
            if "as_fast" in v:
                parts.append(f"the most accurate at least as fast, {v['as_fast']['name']}, is {v['as_fast']['points']:+.2f} points")
            text += "NOT matched at both: " + ("; ".join(parts) or f"no toolkit {v['class']} model is as accurate or as fast")
        lines.append(text)
    for name in peers["missing"]:
        lines.append(f"- {name}: not measured ({by[name]['status']})")
    s, r = goal["static"], goal["refine"]
    lines += ["", f"**The static student (unrefined) at least as accurate as model2vec's own distillation at the same "
                  f"dimensions (vocabulary x 256): {_verdict(s['met'])}.**"]
    if s["met"] is not None:
        sizes = ", ".join(f"{n} {_f(by[n].get('mb'), 1)} MB" for n in ("tk-static", "model2vec") if n in by)
        lines.append(f"tk-static {_f(s['static'])} against model2vec {_f(s['model2vec'])} ({s['points']:+.2f} points); "
                     f"refined: {_f(s['refined'])}. On disk: {sizes} (model2vec's distill stores float16 by default, "
                     "compress distill-static float32).")
    lines += ["", f"**Refining it on the user's sentences adds >= {REFINE_GAIN:g} Spearman points: {_verdict(r['met'])}.**"]
    if r["met"] is not None:
        lines.append(f"{_f(r['static'])} -> {_f(r['refined'])}: {r['gain']:+.2f} points"
                     + ("" if r["met"] else f" (the gap: {REFINE_GAIN - r['gain']:.2f} points short)") + ".")
    return lines


def runtime_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each toolkit runtime on the peers' own weights against the fastest peer of its precision class (same weights,
    so the speed is the runtime's and the feeding's alone)."""
    ratios = runtime_ratios(rows)
    lines = ["## Each toolkit runtime against the fastest peer on the same weights", "",
             f"Wanted: at least {RUNTIME_WITHIN:.0%} of the fastest peer's sentences/s of the same precision class, at "
             "batch 1 and at batch 32 apart (all-MiniLM-L6-v2's own weights in every row).", "",
             "| toolkit runtime | class | b1: x fastest peer | b32: x fastest peer |", "|---|---|--:|--:|"]

    def cell(at: dict[str, Any] | None) -> str:
        if at is None:
            return "no peer"
        return f"{at['ratio']:.2f}x {at['peer']}" + ("" if at["met"] else " (below)")

    for r in ratios:
        lines.append(f"| {r['name']} | {r['class']} | {cell(r['b1'])} | {cell(r['b32'])} |")
    both = [r["name"] for r in ratios if r["b1"] and r["b32"] and r["b1"]["met"] and r["b32"]["met"]]
    lines += ["", f"Within {1 - RUNTIME_WITHIN:.0%} at both batch sizes: {', '.join(both) or 'none'}."]
    return lines


def render(result: dict[str, Any]) -> str:
    h, rows = result["header"], result["rows"]
    lines = ["# all-MiniLM-L6-v2 and its peers: accuracy, size and speed in one run", "", *header_lines(h), "",
             "## Results", "",
             "Spearman and MRPC x100; MB: the files holding the weights; sent/s: sentences per second, text to embedding; "
             "front: on the Pareto front of Spearman against speed at b1 and/or b32; cos to ST: cosine of each scored "
             "sentence's embedding with sentence-transformers' own (PyTorch) one (— where the width differs).", "",
             *table(rows, result["front"]), "", "![STS-B Spearman against sentences per second at batch 1 and batch 32](pareto.png)", "",
             "## Goal", "", *goal_lines(result["goal"], rows), "", *runtime_lines(rows), "", "## Embedding check", ""]
    fp32 = [r for r in rows if r["precision"] == "fp32" and r.get("model") == "teacher" and r.get("agreement")
            and r["name"] != "st-torch"]
    low = [r for r in fp32 if r["agreement"]["min"] <= FP32_MIN_COSINE]
    lines.append(f"Every fp32 contender of the teacher should give the teacher's embeddings (cosine > {FP32_MIN_COSINE} for "
                 f"every scored sentence): {len(fp32) - len(low)} of {len(fp32)} do"
                 + (f"; below: {', '.join(r['name'] for r in low)}" if low else "") + ". The int8 rows' and the students' "
                 "cosines are in the table (what quantization and distillation move).")
    lines += ["", "## What each contender is", "", "| contender | what | made with | environment |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['label']} | {r.get('made_with', '—')} | {r['venv']} |")
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", "## Failures", "", *(f"- {r['name']}: {r['status']}" for r in failed)]
    lines += ["", "## Build steps", "", "| step | environment | minutes | |", "|---|---|--:|---|"]
    for name, s in h["steps"].items():
        state = "reused from an earlier run" if s["cached"] else ("FAILED" if s["error"] else "built in this run")
        lines.append(f"| {name} | {s['venv']} | {_f((s['seconds'] or 0) / 60, 1)} | {state} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], front: dict[str, list[str]], path: Path) -> None:
    """Spearman against sentences/s (log x) at batch 1 and at batch 32, side by side.

    Each contender is a number beside its marker (peers squares, toolkit circles) and the key on
    the right names the numbers: the teacher's many runtimes sit within a point of each other, where
    names would print over one another. Each panel's Pareto front is a dashed line.
    """
    import matplotlib  # deferred: only the report draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.get("spearman") is not None and r.get("b1") and r.get("b32")]
    if not shown:
        return
    number = {r["name"]: i + 1 for i, r in enumerate(shown)}
    style = {"peer": ("s", "tab:orange"), "toolkit": ("o", "tab:blue")}
    fig, axes = plt.subplots(1, 2, figsize=(14, 6.5), sharey=True)
    for ax, speed, title in zip(axes, ("b1", "b32"), ("batch 1 (one sentence per call)", "batch 32")):
        for side, (marker, color) in style.items():
            mine = [r for r in shown if r["side"] == side]
            ax.scatter([r[speed] for r in mine], [r["spearman"] for r in mine], marker=marker, color=color,
                       label=side, zorder=3, s=28)
        for i, r in enumerate(sorted(shown, key=lambda r: (r[speed], r["spearman"]))):
            # Neighbours in speed alternate right-above and right-below their marker.
            ax.annotate(str(number[r["name"]]), (r[speed], r["spearman"]), fontsize=7,
                        xytext=(4, 3 if i % 2 else -9), textcoords="offset points")
        edge = sorted((r for r in shown if r["name"] in front.get(speed, [])), key=lambda r: r[speed])
        ax.plot([r[speed] for r in edge], [r["spearman"] for r in edge], color="gray", linestyle="--",
                label="Pareto front")
        ax.set_xscale("log")
        ax.set_xlabel("sentences per second (log scale)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("STS-B dev Spearman x100")
    axes[0].legend(loc="lower left", fontsize=8)
    key = "\n".join(f"{number[r['name']]:>2}  {r['name']}" for r in shown)
    fig.text(0.835, 0.5, key, fontsize=7, family="monospace", va="center")
    fig.tight_layout(rect=(0, 0, 0.83, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
