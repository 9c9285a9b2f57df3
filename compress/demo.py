"""``compress demo``: the toolkit's flow on generated data, offline, in minutes on a CPU.

Today it exercises the measuring half of the flow: it generates a sentiment task in the
GLUE SST-2 layout and a WordPiece vocabulary, creates two small BERTs, evaluates them
with the official metrics and times them against a GEMM peak, and writes a Markdown
report. The training and compression stages join as they land.
"""

from __future__ import annotations

from pathlib import Path

import shutil

from compress.core.artifacts import check_output


def run_demo(out: str | Path, *, overwrite: bool = False, seed: int = 0) -> Path:
    """Run the demo into the run directory ``out`` and return the report's path.

    Each model directory inside is written atomically by its stage; the run directory
    itself is refused when it is not empty, unless ``overwrite``.
    """
    from compress.core import synthetic
    from compress.core.tasks import get_task
    from eval.evaluate import EvalConfig, evaluate
    from eval.latency import LatencyConfig, format_markdown, measure_latency
    from students.presets import resolve_shape
    from teacher.create import create_model

    out = Path(out)
    check_output(out, overwrite)
    if out.exists():
        shutil.rmtree(out)
    data = synthetic.write_sst2_layout(out / "data", seed=seed)
    vocab = synthetic.write_vocab(out / "vocab" / "vocab.txt")
    models = []
    for shape in ("2L-128", "4L-256"):
        model_dir = out / "models" / f"random-{shape}"
        create_model(resolve_shape(shape), model_dir, tokenizer=vocab, task="sst2", seed=seed, max_positions=128)
        models.append(model_dir)
    evals = [
        evaluate(m, EvalConfig(task="sst2", split="dev", data_dir=str(data), batch_size=64))[0] for m in models
    ]
    latency = measure_latency(
        models, LatencyConfig(batch=(1, 8), seq=(64,), repeats=20, warmup=3, out=str(out / "latency"))
    )

    task = get_task("sst2")
    lines = [
        "# compress demo",
        "",
        f"Generated task: {task.display} layout, rule-based sentiment (see compress/core/synthetic.py), "
        f"data in `data/`. Models are randomly initialised, so accuracy is near chance until the "
        "training stages run.",
        "",
        "| model | dev accuracy | n |",
        "|---|---|---|",
    ]
    for model, record in zip(models, evals):
        lines.append(f"| {model.name} | {record['metrics']['accuracy']:.2f} | {record['n']} |")
    lines += ["", format_markdown(latency)]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report
