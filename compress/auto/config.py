"""``compress auto``'s options (:class:`AutoConfig`, flat on the command line) and their checks, made before any work.

Whether the search is over a task model or a sentence-embedding one is the option ``--embedding``; the search itself
never asks again: :func:`compress.auto.targets.target_kind` turns it into a target object once. The tables the
options are checked against (the variants each backend makes, the embedding scores) live here too, and nothing heavy
is imported: ``compress auto --help`` and a refused option cost no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from compress.auto.engine import check_url
from compress.core.budgets import budget_option
from compress.core.config import check_name, flat_keywords, option
from compress.core.data.config import TaskData
from compress.core.data.tasks import GLUE_TASKS, get_task, is_kind, task_choices
from compress.core.errors import CompressError
from compress.core.paths import work_dir_for
from compress.core.preflight import require_model_dir
from compress.core.train_config import TrainConfig
from compress.distill.config import SENTENCE_TERMS, AugmentConfig, EmbeddingDistillConfig

TASK_LOSSES = ("kd", "hard")  # the candidates' distillation terms unless --losses says otherwise
STSB, COSINE = "stsb", "cosine"  # the two checks that score a model
SCORES = ("auto", STSB, COSINE)

Variant = tuple[str, Any]  # (name, how)

# CTranslate2's Encoder folders, float32 and int8 (its converter's own int8 weights): a task's or an embedding's alike,
# made only of the families its export converts (see compress.auto.variants.skipped).
CTRANSLATE2_VARIANTS: tuple[Variant, ...] = (("ctranslate2-fp32", ("export", "ctranslate2", None)),
                                             ("ctranslate2-int8", ("export", "ctranslate2", "int8")))
# What each backend contributes to a task model: (variant name, how it is made from an fp32 student folder).
TASK_VARIANTS: dict[str, tuple[Variant, ...]] = {
    "torch": (("torch-fp32", None), ("torch-int8", ("quantize", "torch", "dynamic"))),
    "onnxruntime": (("onnxruntime-int8", ("quantize", "onnxruntime", "dynamic")),),
    "openvino": (("openvino-fp32", ("export", "openvino", None)), ("openvino-bf16", ("export", "openvino", "bf16")),
                 ("openvino-int8", ("quantize", "openvino", "static"))),
    "inc": (("inc-int8", ("quantize", "inc", "static")),),
    "ctranslate2": CTRANSLATE2_VARIANTS,
}
# What each backend contributes to an embedding folder: ONNX Runtime's int8 is static (calibrated on the search's
# training sentences); INC cannot calibrate an embedding folder.
EMBEDDING_VARIANTS: dict[str, tuple[Variant, ...]] = {
    "torch": (("torch-fp32", None), ("torch-int8", ("quantize", "torch", "dynamic"))),
    "onnxruntime": (("onnxruntime-int8", ("quantize", "onnxruntime", "static")),),
    "openvino": (("openvino-fp32", ("export", "openvino", None)), ("openvino-bf16", ("export", "openvino", "bf16")),
                 ("openvino-int8", ("quantize", "openvino", "static"))),
    "ctranslate2": CTRANSLATE2_VARIANTS,
}
# Variants that only a CPU with bf16 kernels (AVX512_BF16, AMX-BF16) runs as such: elsewhere they would be their fp32.
BF16_VARIANTS = ("openvino-bf16",)


def parse_minutes(text: str) -> float:
    """``90m``, ``1.5h``, ``45`` (minutes), ``600s`` -> minutes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(h|m|min|s)?\s*", str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise CompressError(f"--time-limit {text!r} is not a duration; write e.g. 90m, 1.5h or 600s")
    return float(m.group(1)) * {"h": 60.0, "s": 1 / 60, None: 1.0}.get(m.group(2), 1.0)


@dataclass(frozen=True)
class EmbeddingSearch:
    """The options of an embedding search (``compress auto --embedding``); flat on the command line."""

    embedding: bool = option(False, "search students of a sentence-embedding teacher (a sentence-transformers folder or a "
                             "bare encoder) instead of a task model: distilled on unlabelled sentences (--corpus, "
                             "--sentences-from), scored by the embedding check (--embedding-score), the chosen one "
                             "written as a sentence-transformers folder")
    corpus: tuple[str, ...] = option(
        (), "with --embedding: unlabelled text the candidates are distilled (and int8 variants calibrated) on: text "
        "files or folders of *.txt (split into sentences), datasets save_to_disk folders, or hf:NAME[:CONFIG]",
        metavar="PATH[,...]")
    sentences_from: tuple[str, ...] = option(
        (), "with --embedding: GLUE tasks whose training sentences are added to that text (both sides of a pair; labels "
        "unused; from --data-dir or the hub)", metavar="TASK[,...]")
    max_sentences: int | None = option(None, "with --embedding: distil on a seeded random sample of N sentences (say so "
                                       "when reporting)")
    check_sentences: int = option(256, "with --embedding: sentences held out before anything trains or calibrates on them "
                                  "(at most half of them); the mean cosine to the teacher's embeddings is measured on them")
    embedding_score: str = option("auto", "with --embedding, what scores every candidate and variant: stsb (STS-B dev "
                                  "Spearman of the pairs' cosine, x100; from --data-dir or the hub), cosine (mean cosine "
                                  "to the teacher's embeddings on the held-out sentences, x100), auto (stsb when "
                                  "--data-dir holds STS-B, else cosine)", choices=SCORES)
    static: bool = option(True, "with --embedding: also a static (model2vec) student, trained once beside the others "
                          "(skipped, saying so, where model2vec is not installed)")

    def validate(self) -> None:
        if self.check_sentences < 1:
            raise CompressError(f"--check-sentences must be at least 1, got {self.check_sentences}")
        if self.max_sentences is not None and self.max_sentences < 2:
            raise CompressError(f"--max-sentences must be at least 2, got {self.max_sentences}")
        if self.embedding_score not in SCORES:
            raise CompressError(f"--embedding-score is one of {', '.join(SCORES)}, got {self.embedding_score!r}")
        for name in self.sentences_from:
            if get_task(name).name not in GLUE_TASKS:
                raise CompressError(f"--sentences-from takes GLUE tasks ({', '.join(GLUE_TASKS)}), not {name!r}")
        if self.embedding and not (self.corpus or self.sentences_from):
            raise CompressError("--embedding distils on unlabelled sentences: pass --corpus FILE_OR_DIR[,...] and/or "
                                "--sentences-from TASK[,...]")
        defaults = EmbeddingSearch()
        given = [f"--{f.name.replace('_', '-')}" for f in fields(self) if getattr(self, f.name) != getattr(defaults, f.name)]
        if not self.embedding and given:
            raise CompressError(f"{given[0]} belongs to a search of sentence-embedding students: add --embedding (a task "
                                "search trains on its task's data)")


def embedding_losses(losses: tuple[str, ...], task_default: tuple[str, ...]) -> tuple[str, ...]:
    """The candidates' distillation terms: ``losses``, or distill-embedding's own when it is the task search's default."""
    chosen = EmbeddingDistillConfig().losses if tuple(losses) == tuple(task_default) else tuple(losses)
    for term in chosen:
        check_name("embedding distillation loss", term, SENTENCE_TERMS)  # an unknown term: one line naming the valid ones
    return chosen


def _auto_defaults() -> TrainConfig:
    return TrainConfig(lr=1e-4, epochs=1, batch_size=32, warmup_ratio=0.1)


@flat_keywords
@dataclass(frozen=True)
class AutoConfig:
    """The options of ``compress auto``; its nested blocks (extra data, task data, sentences, training) are flat on
    the command line too."""

    task: str = option("", "task to find a model for: a benchmark task, or a kind of your own data with --train-file "
                       "(default: the teacher's own task, from its compression.json or config.json)", choices=task_choices)
    budget: str = option("", "what the model must meet, all of them, separated by ';': p50<=6ms@b1,s128 (also p90, p99, "
                         "mean), throughput>=500/s@b32,s128, size<=20MB, speedup>=10x (over the teacher, measured here)",
                         metavar="BUDGET[;...]")
    backends: tuple[str, ...] = option(("torch", "onnxruntime", "openvino", "ctranslate2"), "backends to consider: torch "
                                       "(fp32, dynamic int8), onnxruntime (int8), openvino (fp32, bf16 on a CPU with AVX512_BF16 "
                                       "or AMX-BF16, NNCF int8), inc (static int8), ctranslate2 (float32, its own int8; skipped, "
                                       "saying why, where CTranslate2 cannot convert the teacher or is not installed)",
                                       metavar="NAME[,...]")
    time_limit: str = option("90m", "wall-clock limit of the whole search (90m, 1.5h); 15% of it is kept for the last step")
    shapes: tuple[str, ...] = option((), "candidate student shapes (default: depths 1-6 x widths down to a third of the teacher's x "
                                     "the teacher's FFN ratio or half of it; with --embedding: the teacher's width at depths "
                                     "1-6 x its FFN, half and a quarter of it)",
                                     metavar="SHAPE[,...]")
    probes: int = option(8, "shapes timed to fit the latency model (spread over the candidates), plus 3 held out to test it")
    candidates: int = option(6, "shapes trained in the first round: the best by the prior among those predicted to fit")
    rounds: int = option(3, "successive-halving rounds; each keeps the best 1/eta and trains them eta times as long")
    eta: int = option(2, "successive halving's ratio")
    margin: float = option(0.15, "keep shapes predicted at most this fraction beyond a budget (measurement decides at the end)")
    repeats: int = option(20, "timed passes per model and point in the probe (the final measurement takes twice as many)")
    final_runs: int = option(3, "the final measurement repeats the whole run (every finalist in turn) this many times; a "
                             "budget is met only if met in every run, so a model that fits by luck once is not chosen",
                             metavar="K")
    losses: tuple[str, ...] = option(TASK_LOSSES, "distillation terms of every candidate (see compress distill; with "
                                     "--embedding those of compress distill-embedding, mse,cosine unless given)",
                                     metavar="TERM[,...]")
    init_from: str | None = option(None, "cut the candidates that fit inside it from this encoder DIR instead of the teacher "
                                   "(see compress distill --init-from)", metavar="DIR")
    tie: float = option(0.4, "dev points within which finalists count as equally accurate; among them the one with the most "
                        "room under the timed budgets is chosen, as one that fits by a hair may miss in the next run "
                        "(0: the most accurate)")
    max_drop: float | None = option(1.0, "refuse an int8 variant that loses more than this many dev points (with "
                                    "--embedding: points of the embedding score)")
    resume: bool = option(False, "continue an interrupted search: finished probes and candidates are reused")
    compare: tuple[str, ...] = option((), "model folders to measure in the final run beside the finalists and show in the "
                                      "report (e.g. hand-made students; their dev score is read from their metrics.json); "
                                      "never chosen", metavar="DIR[,...]")
    reuse: tuple[str, ...] = option((), "earlier searches of this teacher and task (their --out folders): their latency probe "
                                    "(same backends, points, probes, shapes) and trained candidates (same training settings) "
                                    "are reused, so searching another budget pays only for what is new", metavar="DIR[,...]")
    workers: int = option(1, "local worker processes training candidates (this one included); each trains one candidate "
                          "at a time, so give each its own cores or GPU")
    storage: str | None = option(None, "database of the search's Optuna study (any SQLAlchemy URL, e.g. "
                                 "postgresql://user:pass@host/db; default: search.db in the work folder). Run the same "
                                 "command with the same --out and --storage on another machine to join a search under way "
                                 "as a worker: candidates' folders live under the coordinator's --out, so every machine "
                                 "needs it on a shared file system", metavar="URL")
    extra_data: AugmentConfig = field(default_factory=AugmentConfig)
    data: TaskData = field(default_factory=TaskData)
    sentences: EmbeddingSearch = field(default_factory=EmbeddingSearch)
    train: TrainConfig = field(default_factory=_auto_defaults)

    @property
    def embedding(self) -> bool:
        """A search of sentence-embedding students (``--embedding``), not of a task model."""
        return self.sentences.embedding

    @property
    def variant_table(self) -> dict[str, tuple[Variant, ...]]:
        """What each backend makes of a candidate: of a task model, or (--embedding) of a sentence-embedding folder."""
        return EMBEDDING_VARIANTS if self.embedding else TASK_VARIANTS

    def validate(self) -> None:
        if self.task and not is_kind(self.task):
            get_task(self.task)
        budget_option(self.budget)
        if self.embedding:  # a task search's options first: "drop --task" says more than "pass --corpus"
            self._check_embedding()
        self.sentences.validate()
        for name in self.backends:
            if name not in self.variant_table:
                raise CompressError(f"unknown backend {name!r} in --backends; valid: {', '.join(self.variant_table)}")
        parse_minutes(self.time_limit)
        for name, value in (("probes", self.probes), ("candidates", self.candidates), ("rounds", self.rounds),
                            ("repeats", self.repeats), ("final-runs", self.final_runs)):
            if value < 1:
                raise CompressError(f"--{name} must be at least 1, got {value}")
        if self.workers < 1:
            raise CompressError(f"--workers must be at least 1 (this process), got {self.workers}")
        if self.storage is not None:
            check_url(self.storage)
        if self.eta < 2:
            raise CompressError(f"--eta must be at least 2, got {self.eta}")
        if self.margin < 0:
            raise CompressError(f"--margin must be 0 or more, got {self.margin}")
        if self.tie < 0:
            raise CompressError(f"--tie must be 0 (the most accurate alone) or more dev points, got {self.tie}")
        if self.init_from and not (Path(self.init_from) / "config.json").is_file():  # said now, not after the probe
            raise CompressError(f"--init-from {self.init_from} is not a model directory (no config.json); pass an encoder folder")
        for folder in self.compare:
            require_model_dir(folder)  # before hours of search, not at its end
        for folder in self.reuse:
            if not (work_dir_for(Path(folder)) / "state.json").is_file():
                raise CompressError(f"--reuse {folder}: no search was found there (its work folder "
                                    f"{work_dir_for(Path(folder))} holds no state.json); give the --out folder of an earlier search")

    def _check_embedding(self) -> None:
        """Refuse, one line each, the options of a task search given to an --embedding one."""
        if self.task:
            raise CompressError(f"--embedding searches sentence-embedding students, which have no task: drop --task {self.task} "
                                "(or drop --embedding to search students of the task)")
        if self.data.train_file or self.data.dev_file:
            raise CompressError("--train-file/--dev-file are a task's data; an --embedding search distils on unlabelled "
                                "sentences: pass them as --corpus FILE_OR_DIR[,...]")
        if self.init_from:
            raise CompressError("--init-from cuts task students from another encoder; an --embedding search cuts its "
                                "students from the teacher: drop --init-from")
        if self.extra_data != AugmentConfig():
            raise CompressError("--augment and --transfer-text enlarge a task's training set; an --embedding search "
                                "distils on --corpus/--sentences-from: drop them")
        if "inc" in self.backends:
            raise CompressError("--backends inc cannot calibrate a sentence-embedding folder; with --embedding choose among "
                                f"{', '.join(EMBEDDING_VARIANTS)}")
        embedding_losses(self.losses, TASK_LOSSES)
