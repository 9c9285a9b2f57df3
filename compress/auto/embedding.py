"""``compress auto --embedding``'s pieces: its options, sentences, candidates and score.

:mod:`compress.auto.run` runs an embedding search as it runs a task search (latency probe and model, budgets, successive
halving as an Optuna study, final measurement, report, pareto plot), through the search target
:class:`compress.auto.targets.EmbeddingTarget`; this module holds what differs:

- **Sentences.** Gathered once, as ``compress distill-embedding`` gathers them (``--corpus``, ``--sentences-from``:
  distinct, in a seeded order), by :func:`prepare`. The first ``--check-sentences`` (at most half) are held out
  (``sentences/check.txt`` in the work folder) before anything sees them; every candidate is distilled, every int8
  variant calibrated and the static student refined on the rest (``sentences/train.txt``).
- **Candidates.** The teacher's width (a narrower one would learn PCA-reduced targets, a lossy step the search
  leaves to `distill-embedding`) at fewer layers
  and narrower FFNs (:func:`candidate_shapes`), distilled by ``distill_embedding`` (round 0 cut from the teacher, a
  later round continuing the one before); and one static student (``distill_static``, model2vec), trained once beside
  the halving as it has no shape to halve, skipped with a log line where model2vec is not installed.
- **Variants** (:data:`compress.auto.variants.EMBEDDING_VARIANTS`). torch fp32 and dynamic int8, ONNX Runtime and
  OpenVINO static int8 calibrated on the training sentences, OpenVINO fp32 and bf16 (where the CPU has bf16 kernels);
  INC cannot calibrate an embedding folder.
- **Score.** One check for every candidate, variant and compared model, chosen once (``--embedding-score``): STS-B dev
  Spearman of each pair's cosine (x100, as ``compress eval --embedding --task stsb`` scores it) when STS-B is asked
  for, or found under ``--data-dir``; else the mean cosine (x100) of the model's embeddings to the teacher's on the
  held-out sentences, as the quantize embedding guard compares int8 with fp32 embeddings.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

# The search's options (and the checks an embedding search's options take) live with the other options.
from compress.auto.config import COSINE, STSB, EmbeddingSearch, embedding_losses  # noqa: F401
from compress.core.formats.artifacts import load_config, load_tokenizer, model_format, saved_head
from compress.core.formats.layout import STATIC
from compress.core.formats.records import read_record
from compress.core.formats.schemas import NUMBER, STR, Record, Schema, optional
from compress.core.formats.writes import write_json_atomic, write_text_atomic
from compress.core.data.sources import DataSource, load_split
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import encode, read_spec
from compress.core.model.shapes import Shape, resolve_shape
from compress.core.model.structure import config_sizes
from compress.core.data.tasks import get_task
from compress.core.train import TrainConfig
from compress.distill.embedding import EmbeddingDistillConfig, distill_embedding, embedding_sentences
from compress.distill.static import StaticDistillConfig, distill_static, model2vec
from compress.eval.embeddings import cosine_rows, embedding_scorer
from compress.quantize.config import QuantizeConfig

log = logging.getLogger(__name__)

SENTENCES = "sentences"  # the work folder's subfolder holding the split sentences and the teacher's embeddings
TARGET_FILE, CHECK_FILE, TRAIN_FILE, TEACHER_FILE = "target.json", "check.txt", "train.txt", "teacher.npy"
STATIC_LABEL, STATIC_VARIANT = "static", "model2vec"  # the static student's label among the candidates, its variant
STATIC_PCA = 256  # model2vec's own default dimension, for a static student scored on STS-B
BATCH = 64  # sentences per forward pass when scoring
# target.json as prepare() writes it, the fields load_check reads back.
TARGET = Schema(Record({"score": STR, "description": STR, "teacher": NUMBER, "data_dir": optional(STR)},
                       required=("score", "description", "teacher")),
                fix="remove that folder to prepare the sentences again (drop --resume)")


@dataclass(frozen=True)
class EmbeddingCheck:
    """What an embedding search scores every model by, where a task search has its dev set: its held-out and training
    sentences and its score (``target.json`` in the work folder's ``sentences/``)."""

    root: Path  # the work folder's sentences/
    score: str  # STSB or COSINE
    description: str  # what the score is, in the report's words
    teacher: float = math.nan  # the teacher's score
    data_dir: str | None = None  # where STS-B's dev split is read (None: the hub)

    @property
    def train_file(self) -> Path:
        return self.root / TRAIN_FILE

    def check_sentences(self) -> list[str]:
        return (self.root / CHECK_FILE).read_text(encoding="utf-8").splitlines()


def check_teacher(teacher_dir: Path) -> None:
    """Refuse, in one line, a teacher an embedding search cannot distil: a task model or a static folder."""
    if model_format(teacher_dir) == STATIC:
        raise CompressError(f"{teacher_dir} is a static (model2vec) folder: it has no layers to distil a student from; "
                            "pass the transformer it was made from as --teacher")
    head = saved_head(teacher_dir)
    if head != "base":
        raise CompressError(f"{teacher_dir} is a {head} model, not a sentence-embedding one: --embedding distils a "
                            "sentence-transformers folder (or a bare encoder); drop --embedding to search students of its task")


def candidate_shapes(teacher_config, names: tuple[str, ...] = ()) -> list[Shape]:
    """The shapes to search: ``names`` (each of the teacher's width), or depths 1..teacher x FFN the teacher's, half
    and a quarter of it, all at the teacher's width and heads (a narrower student would learn PCA-reduced targets)."""
    sizes = config_sizes(teacher_config)
    if names:
        shapes = [resolve_shape(n) for n in names]
        wrong = next((s for s in shapes if s.hidden != sizes.hidden), None)
        if wrong is not None:
            raise CompressError(f"--shapes {wrong.label}: an embedding student keeps the teacher's width {sizes.hidden} (its "
                                f"embeddings live in the teacher's space); vary layers and FFN, e.g. 3L-{sizes.hidden}-"
                                f"{sizes.ffn // 2}")
        return [Shape(s.layers, s.hidden, sizes.heads, s.ffn) for s in shapes]
    depths = sorted({d for d in (1, 2, 3, 4, 6) if d <= sizes.layers} | {max(1, sizes.layers // 2)})
    ffns = [f for f in dict.fromkeys([sizes.ffn, sizes.ffn // 2, sizes.ffn // 4]) if f >= 1]
    return [Shape(depth, sizes.hidden, sizes.heads, ffn) for depth in depths for ffn in ffns]


# ---------------------------------------------------------------------------- the sentences and the score


def prepare(teacher_dir: Path, options: EmbeddingSearch, data_dir: str | None, seed: int, work: Path) -> EmbeddingCheck:
    """Split the search's sentences once into held-out and training ones, fix the score and the teacher's; a resumed
    search keeps what it prepared (``target.json`` is written last, so a half-prepared folder is prepared again)."""
    root = work / SENTENCES
    if (root / TARGET_FILE).is_file():
        return load_check(work)
    gather = EmbeddingDistillConfig(corpus=options.corpus, sentences_from=options.sentences_from, data_dir=data_dir,
                                    heldout_sentences=0, seed=seed)
    sentences, sources = embedding_sentences(gather)  # distinct, in the seeded order; at least 2, or a one-line error
    n_check = min(options.check_sentences, len(sentences) // 2)
    check, train = sentences[:n_check], sentences[n_check:][: options.max_sentences]
    if len(train) < 2:
        raise CompressError(f"only {len(sentences)} sentences were found, too few to hold {n_check} out and distil on the "
                            "rest; add text (--corpus) or lower --check-sentences")
    root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(root / CHECK_FILE, "\n".join(check) + "\n")  # one sentence a line (whitespace normalised)
    write_text_atomic(root / TRAIN_FILE, "\n\n".join(train) + "\n")  # a blank line between them: each its own document
    score = _score_kind(options.embedding_score, data_dir)
    made = EmbeddingCheck(root, score, _description(score, len(check), data_dir), data_dir=data_dir)
    if score == COSINE:
        np.save(root / TEACHER_FILE, _embeddings(teacher_dir, check))  # (check sentences, d)
    made = replace(made, teacher=score_folder(teacher_dir, made))
    write_json_atomic(root / TARGET_FILE, {"score": score, "description": made.description, "teacher": made.teacher,
                                           "data_dir": data_dir, "check_sentences": len(check),
                                           "train_sentences": len(train), "sources": sources})
    log.info("sentences: %d held out, %d to distil on; score: %s (the teacher: %.2f)", len(check), len(train),
             made.description, made.teacher)
    return made


def load_check(work: Path) -> EmbeddingCheck:
    """The embedding search :func:`prepare` made in ``work`` (a worker reads the coordinator's)."""
    root = work / SENTENCES
    if not (root / TARGET_FILE).is_file():
        raise CompressError(f"{root} holds no prepared sentences ({TARGET_FILE}): the process that starts an --embedding "
                            "search prepares them before any candidate trains; start it first")
    data = read_record(root / TARGET_FILE, TARGET)
    return EmbeddingCheck(root, data["score"], data["description"], float(data["teacher"]), data.get("data_dir"))


def _score_kind(choice: str, data_dir: str | None) -> str:
    """``--embedding-score`` resolved: auto is STS-B when ``data_dir`` holds its dev split, else the cosine."""
    if choice != "auto":
        return choice
    if data_dir is None:
        return COSINE
    try:
        _stsb_dev(data_dir)
    except CompressError:
        log.info("no STS-B dev split under --data-dir %s: every model is scored by its cosine to the teacher", data_dir)
        return COSINE
    return STSB


def _stsb_dev(data_dir: str | None):
    return load_split(get_task(STSB), "dev", DataSource(data_dir=data_dir))


def _description(score: str, n_check: int, data_dir: str | None) -> str:
    if score == STSB:
        return (f"STS-B dev Spearman (x100) of the cosine of each pair's embeddings, as compress eval --embedding scores "
                f"it (data: {data_dir or 'the Hugging Face hub'})")
    return (f"mean cosine (x100) of the model's embeddings to the teacher's on {n_check} held-out sentences that no "
            "model trained or was calibrated on")


def _embeddings(folder: Path, texts: list[str]) -> np.ndarray:
    """The folder's embeddings of ``texts`` as the toolkit's runtime computes them (any format; the folder's pooling
    and normalisation): (n, d)."""
    return encode(load_model(folder, head="base"), load_tokenizer(folder), texts, read_spec(folder), batch_size=BATCH)


def score_folder(folder: Path, check: EmbeddingCheck) -> float:
    """The search's score of one model folder, in points (x100): any format the runtime loads (fp32, int8, ONNX,
    OpenVINO, static)."""
    if check.score == STSB:
        task, ds = get_task(STSB), _stsb_dev(check.data_dir)
        metrics, _ = embedding_scorer(load_tokenizer(folder), task, ds, read_spec(folder), batch_size=BATCH)(
            load_model(folder, head="base"))
        return float(metrics["spearmanr"])
    mine = _embeddings(folder, check.check_sentences())  # (n, d)
    teacher = np.load(check.root / TEACHER_FILE)  # (n, d)
    if mine.shape != teacher.shape:
        raise CompressError(f"{folder} embeds in {mine.shape[1]} dimensions, the teacher in {teacher.shape[1]}: a cosine to "
                            "the teacher's embeddings needs its space; score on STS-B (--embedding-score stsb)")
    return float(100.0 * cosine_rows(mine, teacher).mean())


def variant_score(path: Path, check: EmbeddingCheck, fp32: float, max_drop: float | None) -> float:
    """An int8 or bf16 variant's own score; refused (CompressError) when it is more than ``max_drop`` points below its fp32's."""
    score = score_folder(path, check)
    if max_drop is not None and fp32 - score > max_drop:
        raise CompressError(f"{path.name} scores {score:.2f}, {fp32 - score:.2f} points below its fp32 model's {fp32:.2f}: "
                            f"more than --max-drop {max_drop:g}")
    return score


# ---------------------------------------------------------------------------- candidates and variants


def train_candidate(teacher_dir: Path, check: EmbeddingCheck, shape: Shape, out: Path, *, init: str, epochs: int,
                    losses: tuple[str, ...], train: TrainConfig, max_length: int | None) -> float:
    """Distil ``shape`` on the search's training sentences into ``out`` (``init``: teacher, or an earlier round's
    folder to continue) for ``epochs``; its score."""
    cfg = EmbeddingDistillConfig(corpus=(str(check.train_file),), student=f"{shape.layers}L-{shape.hidden}-{shape.ffn}",
                                 heads=shape.heads, init=init, losses=losses, train=replace(train, epochs=epochs),
                                 **({"max_length": max_length} if max_length else {}))
    distill_embedding(teacher_dir, out, cfg, overwrite=True)
    return score_folder(out, check)


def train_static(teacher_dir: Path, check: EmbeddingCheck, train: TrainConfig, out: Path) -> dict | None:
    """The static student (model2vec's table of the teacher, refined on the training sentences), trained once: its
    entry (score NaN when it failed), or None where model2vec is not installed."""
    try:
        model2vec()
    except CompressError as err:
        log.info("no static candidate: %s", err)
        return None
    # A cosine to the teacher's embeddings needs the teacher's space: no PCA then (it would rotate the table's).
    width = config_sizes(load_config(teacher_dir)).hidden
    cfg = StaticDistillConfig(pca_dims=None if check.score == COSINE else min(STATIC_PCA, width),
                              corpus=(str(check.train_file),), seed=train.seed, device=train.device)
    started = time.monotonic()
    if out.exists():  # a run killed while writing it: made afresh
        shutil.rmtree(out)
    try:
        distill_static(teacher_dir, out, cfg, overwrite=True)
        score = score_folder(out, check)
    except CompressError as err:
        log.warning("static candidate failed: %s", err)
        score = math.nan
    return {"label": STATIC_LABEL, "round": 0, "epochs": cfg.train.epochs, "score": score, "dir": str(out),
            "teacher": check.teacher, "seconds": round(time.monotonic() - started, 1), "init": "model2vec"}


def quantize_config(check: EmbeddingCheck, backend: str, scheme: str, seed: int, probe: bool) -> QuantizeConfig:
    """How an embedding folder becomes an int8 variant: calibrated on the training sentences (a probe's random-weight
    shape on a few), its guard's cosine to fp32 checked on a few of them; the search scores the result itself."""
    return QuantizeConfig(backend=backend, scheme=scheme, corpus=(str(check.train_file),), seed=seed, max_drop=None,
                          calibration_examples=16 if probe else 128, check_sentences=8 if probe else 64)
