"""``compress demo``: the whole toolkit on generated data, offline, in minutes on a CPU.

It generates a text corpus and a sentiment task whose label follows a rule (negation
flips the polarity) in the GLUE SST-2 layout, then runs ``recipes/demo.yaml``: pretrain a
tiny BERT with MLM + NSP, fine-tune it, distil a smaller student, prune half of the
teacher's heads with recovery, quantize to int8 (ONNX Runtime and PyTorch), measure
latency, and write the leaderboard report. With ``data_dir`` the same pipeline runs on
a real GLUE SST-2 folder (its training sentences double as the pretraining corpus).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from compress.core import synthetic
from compress.core.artifacts import check_output
from compress.core.data import DataSource, load_split
from compress.core.errors import CompressError
from compress.core.tasks import get_task
from compress.pipeline import run_recipe

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "demo.yaml"


def _write_corpus(path: Path, sentences: list[str], per_document: int = 8) -> Path:
    """Documents of ``per_document`` sentences separated by blank lines (the pretraining format)."""
    docs = [" ".join(sentences[i : i + per_document]) for i in range(0, len(sentences), per_document)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def prepare_data(out: Path, data_dir: str | Path | None, seed: int) -> tuple[Path, dict[str, str]]:
    """Task data and pretraining corpus for the demo; returns the task folder and recipe variables."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    if data_dir is None:
        synthetic.write_sst2_layout(data, n_train=2000, n_dev=400, n_test=100, seed=seed)
        sentences = [text for text, _ in synthetic.examples(4000, seed=seed + 7)]
        variables = {"data_dir": str(data), "train_examples": "2000", "vocab_size": "200"}
    else:
        train = load_split(get_task("sst2"), "train", DataSource(data_dir=str(data_dir)))
        sentences = train["sentence"][:20000]
        variables = {"data_dir": str(Path(data_dir).absolute()), "train_examples": "4000", "vocab_size": "4000"}
    _write_corpus(data / "corpus.txt", sentences)
    return data, variables


def run_demo(out: str | Path, *, overwrite: bool = False, seed: int = 0, data_dir: str | Path | None = None, say=print) -> Path:
    """Run the demo into the run directory ``out``; return the report's path."""
    if not RECIPE.is_file():
        raise CompressError(f"the demo recipe {RECIPE} is missing; reinstall compress from its repository")
    out = Path(out).absolute()
    check_output(out, overwrite, inputs=data_dir)
    if out.exists():
        shutil.rmtree(out)
    _, variables = prepare_data(out, data_dir, seed)
    run_recipe(RECIPE, out, variables=variables, say=say)
    return out / "report.md"


def headline(report: Path) -> str:
    """The first table of the report (what the demo prints at the end)."""
    lines = report.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return ""
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])
