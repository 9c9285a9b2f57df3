"""Knowledge distillation from a fine-tuned teacher into a smaller student.

``distill(teacher, out, cfg)`` builds the student (from chosen teacher layers, at random,
or from any pretrained directory), then trains it on the task with a weighted sum of
loss terms chosen by name:

=============  =================================================================  ============
term           what                                                               paper
=============  =================================================================  ============
``kd``         soft-target KL at temperature T, x T² (MSE on logits for STS-B;     Hinton 2015,
               start/end KL for SQuAD)                                             DistilBERT
``hard``       the task loss on gold labels (mixed with ``kd`` by alpha)
``hidden``     MSE between mapped hidden states, learned projection if widths      TinyBERT
               differ
``embedding``  MSE between embedding-layer outputs                                 TinyBERT
``attention``  MSE between mapped attention maps                                   TinyBERT
``cosine``     1 - cos between last hidden states                                  DistilBERT
``minilm``     last-layer attention KL + value-relation KL                         MiniLM
=============  =================================================================  ============

When only ``kd``/``hard`` are used (or hidden states are cached too), the teacher runs
once over the training set and its outputs are cached on disk (``compress.distill.teacher_cache``);
otherwise it runs alongside the student. TinyBERT's order (intermediate layers first,
then the prediction layer) is ``two_stage``. Rows without gold labels can be added to the
training set (``--augment N``: TinyBERT's word-replacement copies; ``--transfer-text``:
unlabelled text in the task's format; both from :mod:`compress.distill.augment`): they are
marked ``gold = 0``, the teacher's outputs are their only targets and the ``hard`` term
skips them; with ``two_stage`` the prediction stage reads them (the intermediate one too
with ``--augment-intermediate``).

The student may have a tokenizer of its own (``--init DIR`` of another vocabulary: a MiniLM student with BERT's
WordPiece under an MPNet teacher): each model then tokenises the text itself, the student is trained, evaluated and
saved with its own, and the logit terms meet per example (per word for tags; on SQuAD at the start/end boundaries both
tokenizations share, through character offsets); the intermediate terms are refused
(:mod:`compress.distill.cross_tokenizer`).

The loss terms are :mod:`compress.distill.terms`; the steps every distillation takes (open the
teacher, build the student, train keeping the best evaluation, record and write) are
:mod:`compress.distill.steps`, shared with :mod:`compress.distill.general` and
:mod:`compress.distill.embedding`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import datasets
import torch

from compress.distill.augment import AugmentConfig, EmbeddingNeighbours, MaskedLMCandidates, augmented_rows, transfer_rows
from compress.core.formats.folder import ModelFolder
from compress.core.formats.records import read_metrics, utc_now
from compress.core.data.features import collate, train_features
from compress.core.data.sources import DataSource, TaskData, TaskSplits, load_split, read_task_data
from compress.core.errors import CompressError
from compress.core.data.resolve import resolve_task, task_fields
from compress.core.formats.runtime import load_folder_model
from compress.core.model.heads import HEADS
from compress.core.model.structure import config_sizes
from compress.core.data.tasks import GLUE_TASKS, Task, get_task
from compress.core.checkpoints import prepare_work_dir, work_dir_for
from compress.core.processes import is_main_process, main_process_first
from compress.core.train import Phase, TrainConfig
from compress.distill.steps import (
    Distiller,
    Student,
    Teacher,
    build_student,
    check_out,
    device_for,
    distill_record,
    make_loss_fn,
    make_projections,
    open_teacher,
    student_tokenizer,
    teacher_layers,
    train_keeping_best,
    write_student,
)
from compress.distill.cross_tokenizer import MEETING_COLUMNS, TeacherRows, check_terms, meeting_batch
from compress.eval.evaluate import dev_evaluator, format_table, output_to_task_labels, split_records, test_records
from compress.eval.metrics import chance_check
from compress.distill.config import AUTO_MAX_EXAMPLES, INTERMEDIATE_TERMS, PREDICTION_TERMS, DistillConfig, check_extra_data
from compress.distill.terms import needs_of
from compress.teacher.corpus import read_documents
from compress.teacher.presets import open_model
from compress.distill.teacher_cache import default_cache_dir, load_or_build

log = logging.getLogger(__name__)


@dataclass
class _TaskData:
    """The task's training features and dev splits, as distillation reads them.

    ``features`` holds the gold training rows first, then the augmented and transfer
    rows; its ``cache_index`` column is the row number (the teacher cache's row) and its
    ``gold`` column is 1 for a row with a gold label, 0 for one with teacher targets only.
    """

    features: object  # tokenised training set (datasets.Dataset)
    dev: dict  # dev split name -> raw examples
    n_train: int  # gold rows (the first n_train of features)
    max_length: int
    pad: Callable  # pads a list of features into a batch
    extra: dict = field(default_factory=dict)  # how the augmented / transfer rows were made (compression.json "extra_data")
    test: object = None  # the --test-file examples (datasets.Dataset), scored once the best student is kept
    teacher_rows: TeacherRows | None = None  # a student with its own tokenizer: the teacher's tokenisation of the rows

    def gold_only(self):
        return self.features.select(range(self.n_train))

    def teacher_inputs(self, gold_only: bool) -> tuple[object, Callable]:
        """(features, collator) the teacher reads: the student's own, or its own tokenisation of the same rows."""
        if self.teacher_rows is None:
            return (self.gold_only() if gold_only else self.features), self.pad
        own = self.teacher_rows
        return (own.gold() if gold_only else own.features), own.pad


def distill(teacher: str | Path, out: str | Path, cfg: DistillConfig, *, overwrite: bool = False,
            task: Task | None = None) -> Path:
    """Distil ``teacher`` into a ``cfg.shape`` student on its task; write the best dev student to ``out``.

    The task is ``task`` when a caller has resolved it, else what ``cfg.task`` (or the teacher) names.
    Four steps: open the run (output, task, the task's data read and checked, teacher, student), tokenise the data,
    train, write.
    """
    run = _open(teacher, out, cfg, overwrite, task)
    data = _task_data(run.task, run.teacher, run.student, cfg, run.splits)
    trained = _train(run, data, cfg)
    return _write(run, data, trained, cfg, overwrite)


@dataclass
class _Run:
    """One task distillation: where it writes, its task, the teacher, the student and the task's data."""

    out: Path
    task: Task
    teacher: Teacher
    student: Student
    splits: TaskSplits  # the task's data as read, before the teacher was loaded
    work: Path | None = None  # checkpoints beside the output, set when training starts
    teacher_dev: dict = field(default_factory=dict)  # the teacher's dev metrics and its fitness check (rank 0)


def _open(teacher: str | Path, out: str | Path, cfg: DistillConfig, overwrite: bool, task: Task | None) -> _Run:
    """The output checked, the task's data read, the teacher opened on its task (refused when its labels are not the
    task's), the student built."""
    out = check_out(out, cfg, overwrite, teacher)
    folder = open_model(teacher).check_torch("distillation (the teacher)")  # the one opening of the teacher's folder
    config = folder.config  # read with the opening: the teacher's outputs are checked against the task before any data
    task = task or resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file, model=folder)
    check_extra_data(task, cfg)
    _check_teacher(config, folder.path, task)
    # Every split is read and checked before the teacher's tokenizer and weights are loaded: a data error costs no model.
    splits = read_task_data(task, cfg.data, seed=cfg.train.seed)
    teach = open_teacher(folder, task.behaviour.head, needs_of(cfg.losses))
    tokenizer = student_tokenizer(teach, cfg, cfg.init_from)
    if tokenizer is not teach.tokenizer:  # its own: each tokenises the text itself; the terms that cannot meet refused
        check_terms(task, cfg.losses)
    student = build_student(teach, cfg, needs_of(cfg.losses), cfg.loss.layer_map, source=cfg.init_from, tokenizer=tokenizer)
    return _Run(out, task, teach, student, splits)


def _train(run: _Run, data: "_TaskData", cfg: DistillConfig) -> "_Trained":
    """Train through the stages on the best device; the teacher's dev score is measured (and judged) first."""
    device = device_for(run.teacher, cfg.train.device)
    wrapper = Distiller(run.student.model, make_projections(run.student.model, run.teacher.model, cfg.losses))

    def evaluator(tokenizer):
        return dev_evaluator(run.task, tokenizer, data.dev, data.max_length, batch_size=cfg.data.eval_batch_size,
                             doc_stride=cfg.data.doc_stride)

    evaluate = evaluator(run.teacher.tokenizer)
    # The teacher's dev score, before any training: a teacher that is not fine-tuned for the task is said now.
    run.teacher_dev = _teacher_dev(run.teacher, run.task, data.dev, evaluate) if is_main_process() else {}
    run.work = prepare_work_dir(work_dir_for(run.out), cfg.resume)
    student_evaluate = evaluator(run.student.tokenizer) if run.student.apart else evaluate  # each with its own tokens
    return _train_stages(run, data, cfg, wrapper, student_evaluate, device)


def _write(run: _Run, data: "_TaskData", trained: "_Trained", cfg: DistillConfig, overwrite: bool) -> Path:
    """The best student with its records (dev, retention, training, the test file's scores) in ``run.out`` (rank 0)."""
    if not is_main_process():
        return run.out
    task, teach, student = run.task, run.teacher, run.student
    metrics = _task_metrics(task, data, trained, run.teacher_dev, cfg)
    metrics += test_records(student.model, student.tokenizer, task, data.test, cfg.data, data.max_length)
    check = run.teacher_dev["check"]
    record = distill_record("distill", cfg, teach, student, **task_fields(task), losses=list(cfg.losses), best=trained.best,
                            cache=trained.cache, extra_data=data.extra, teacher_check=check,
                            teacher_at_chance=check["at_chance"])
    return write_student(student, run.out, teach, record, metrics, resume=cfg.resume, overwrite=overwrite, work=run.work)


def summarize(out: Path, cfg: DistillConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress distill`` prints: the dev results, then how much of the teacher's score the student keeps."""
    results = read_metrics(out)
    lines = [format_table([r for r in results if r.get("kind") == "eval"])]
    notes = []
    training = next((r for r in results if r.get("kind") == "training"), {})
    if training.get("extra_rows"):
        lines.append(f"trained on {training['n_train']} labelled examples + {training['extra_rows']} augmented / transfer "
                     "rows with teacher targets only")
    for r in results:
        if r.get("kind") == "retention" and r.get("ratio") is not None:
            lines.append(f"retention: {r['student']:.2f} / {r['teacher']:.2f} = {100 * r['ratio']:.1f}% of the teacher's {r['metric']}"
                         + teacher_flag(r))
        if r.get("kind") == "retention" and r.get("teacher_warning"):
            notes.append(f"warning: {r['teacher_warning']}")
    return "\n".join(lines), notes


def teacher_flag(record: dict) -> str:
    """What follows a score compared with a teacher that is not fine-tuned for the task ("" when it is)."""
    if record.get("teacher_at_chance"):
        return " -- TEACHER AT CHANCE: this ratio means nothing"
    return " -- TEACHER NOT FINE-TUNED FOR THE TASK" if record.get("teacher_warning") else ""


def teacher_problems(folder: ModelFolder, task) -> list[str]:
    """Signs in its files that ``folder`` is not fine-tuned for ``task``: no head for the task
    (a bare encoder, a sentence-transformers folder), a classifier of another width, another task recorded."""
    saved, head = folder.head, task.behaviour.head
    problems = []
    if saved != head:
        what = "a sentence-transformers folder" if (folder.path / "modules.json").is_file() else f"a {saved} model"
        problems.append(f"it has no {head} head ({what}), so its head is random")
    elif task.behaviour.problem_type is not None and folder.config.num_labels != task.num_labels:
        problems.append(f"its classifier has {folder.config.num_labels} outputs, not {task.num_labels}, so a new random one is used")
    recorded = folder.record.get("task")
    if recorded and _task_name(recorded) != task.name:
        problems.append(f"its compression.json says it was made for {recorded}")
    return problems


def _task_name(name: str) -> str:
    try:
        return get_task(name).name
    except CompressError:
        return name


def check_teacher_fit(folder: ModelFolder, task, metrics: dict | None, labels, *, role: str, advice: str) -> dict:
    """Whether ``folder`` looks fine-tuned for ``task`` (:func:`teacher_problems`, and its dev ``metrics``
    against :func:`compress.eval.metrics.chance_check` with the dev ``labels``); one warning line when not.

    Returns what the output records: ``{"task", "at_chance", "chance", "problems", "warning"}``.
    """
    problems = teacher_problems(folder, task)
    chance = chance_check(task, metrics, labels) if metrics else None
    if chance and chance["at_chance"]:
        problems.append(f"its dev {chance['metric']} {chance['value']:.2f} is at chance ({chance['rule']})")
    warning = None
    if problems:
        warning = f"{role} {folder.path} does not look fine-tuned for {task.display}: {'; '.join(problems)}. {advice}"
        log.warning(warning)
    return {"task": task.name, "at_chance": bool(chance and chance["at_chance"]), "chance": chance,
            "problems": problems, "warning": warning}


def dev_labels(dev: dict):
    """The gold labels of the first dev split (None for SQuAD, whose examples carry answers)."""
    ds = next(iter(dev.values()))
    return ds["label"] if "label" in ds.column_names else None


def _teacher_dev(teacher: Teacher, task, dev: dict, evaluate) -> dict:
    """The teacher's dev metrics (recorded in its metrics.json, else measured now) and the check of its fitness."""
    metrics = _teacher_metrics(task, read_metrics(teacher.folder.path))
    source = "metrics.json"
    if metrics is None:
        metrics, source = evaluate(teacher.model), "measured"
    check = check_teacher_fit(teacher.folder, task, metrics, dev_labels(dev), role="teacher", advice=(
        f"The student learns little from it and its retention means nothing; distil from a model fine-tuned on "
        f"{task.display} (compress teacher finetune)."))
    return {"metrics": metrics, "source": source, "check": check}


def _check_teacher(config, path: Path, task) -> None:
    """Refuse a teacher (its ``config`` read from ``path``) whose outputs are not the task's labels (a classifier of
    another task)."""
    if task.behaviour.label_type is None:  # a span head: no labels to match
        return
    try:
        output_to_task_labels(config, task)
    except CompressError as err:
        raise CompressError(f"teacher {path}: {err}; distil from a teacher fine-tuned on {task.display}") from None


def _task_data(task, teacher: Teacher, student: Student, cfg: DistillConfig, splits: TaskSplits) -> _TaskData:
    """Tokenise the task's ``splits`` (and its augmented / transfer rows) at a length both models take; number the rows.

    A student with its own tokenizer reads its own tokenisation; the teacher its own, of the same rows (when a term
    reads its outputs), kept beside it (``teacher_rows``)."""
    model_max = min(config_sizes(teacher.model.config).max_positions, config_sizes(student.model.config).max_positions)
    max_length = cfg.data.resolved_max_length(task, model_max)
    train_ds = splits.train
    rows, extra = _extra_rows(task, teacher, train_ds, cfg)
    features, n_gold = _numbered(task, student.tokenizer, train_ds, rows, max_length, cfg)
    teacher_rows = None
    if student.apart:
        read = "logits" in needs_of(cfg.losses)  # kd: the teacher's outputs on its own tokens
        own = _numbered(task, teacher.tokenizer, train_ds, rows, max_length, cfg)[0] if read else None
        teacher_rows = TeacherRows.of(task, teacher.tokenizer, own)

        def words():  # each row's words, as the features were made (word tasks: their rows only)
            return [list(w) for w in train_ds["tokens"]] + [list(r["tokens"]) for r in rows]

        features = teacher_rows.student_features(features, student.tokenizer, max_length, words=words, examples=train_ds,
                                                 doc_stride=cfg.data.doc_stride)
    return _TaskData(features, splits.dev, n_gold, max_length, collate(student.tokenizer, task), extra, splits.test,
                     teacher_rows)


def _numbered(task, tokenizer, train_ds, rows: list[dict], max_length: int, cfg: DistillConfig):
    """(features of the gold examples then the extra ``rows`` as ``tokenizer`` makes them, numbered ``cache_index`` and
    marked ``gold``; the number of gold rows)."""
    features = train_features(train_ds, task, tokenizer, max_length, doc_stride=cfg.data.doc_stride)
    n_gold = len(features)
    if rows:
        label = _no_gold(task)
        raw = datasets.Dataset.from_list([{**r, "label": label, "idx": -1} for r in rows])
        more = train_features(raw, task, tokenizer, max_length, doc_stride=cfg.data.doc_stride)
        features = datasets.concatenate_datasets([features, more.cast(features.features)])
    features = features.add_column("cache_index", list(range(len(features))))
    features = features.add_column("gold", [1] * n_gold + [0] * (len(features) - n_gold))
    return features, n_gold


def _no_gold(task: Task):
    """The label of a row with teacher targets only: -100 (ignored by cross-entropy), NaN (poisons any MSE that
    would read it) or a row of them (multi-label); the ``gold`` column is what the hard term selects by."""
    kind = task.behaviour
    return [kind.ignored_label] * task.num_labels if kind.multi_hot else kind.ignored_label


def _extra_rows(task, teacher: Teacher, train_ds, cfg: DistillConfig) -> tuple[list[dict], dict]:
    """Augmented copies of the training texts and transfer rows (texts only), and how they were made."""
    extra_cfg, fields = cfg.extra_data, task.text_fields
    rows, record = [], {}
    soft = "kd" in cfg.losses or bool(set(cfg.losses) & set(INTERMEDIATE_TERMS))
    copies = extra_cfg.copies(len(train_ds), spans=task.behaviour.per_token, soft_targets=soft)
    if copies and extra_cfg.augment is None:
        log.info("augmenting with %d copies per example, the default for a training set of at most %s examples "
                 "(--augment 0 turns it off)", copies, f"{AUTO_MAX_EXAMPLES:,}")
    extra_cfg = replace(extra_cfg, augment=copies)
    if copies:
        texts = [{f: ex[f] for f in fields} for ex in train_ds]
        source, make = _candidate_source(teacher, extra_cfg)
        cache_dir = (Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()) / "augmented"
        with main_process_first():  # one process builds the set, the others read it
            augmented, info = augmented_rows(
                teacher.tokenizer, texts, fields, make, source_hash=f"{make.__name__}:{source.hash}",
                cfg=extra_cfg, seed=cfg.train.seed, cache_dir=cache_dir)
        rows += [{f: r.get(f, "") for f in fields} for r in augmented]
        record["augment"] = {"copies": copies, "default": cfg.extra_data.augment is None, "prob": extra_cfg.augment_prob,
                             "candidates": extra_cfg.augment_candidates,
                             "candidate_model": str(source.path), "rows": len(augmented), **info}
        log.info("augmented %d training examples into %d more rows (%s%s)", len(texts), len(augmented), info["method"],
                 ", from the cache" if info["hit"] else "")
    if extra_cfg.transfer_text:
        limit = extra_cfg.transfer_examples or len(train_ds)
        documents, pairs = _transfer_sources(extra_cfg.transfer_text, task, cfg.data)
        transfer = transfer_rows(documents, fields, limit, cfg.train.seed, pairs)
        rows += transfer
        record["transfer"] = {"sources": list(extra_cfg.transfer_text), "rows": len(transfer)}
        log.info("added %d transfer rows from %s (teacher targets only)", len(transfer), ", ".join(extra_cfg.transfer_text))
    return rows, record


def _candidate_source(teacher: Teacher, cfg: AugmentConfig) -> tuple[ModelFolder, Callable]:
    """The model whose knowledge proposes replacement words, and a builder of its candidate source.

    ``--augment-mlm DIR`` (a masked-LM with the teacher's vocabulary); else the teacher's own
    MLM head when its folder was saved with one; else nearest neighbours in the teacher's
    input embeddings.
    """
    k = cfg.augment_candidates
    if cfg.augment_mlm:
        mlm = open_model(cfg.augment_mlm).check_torch("--augment-mlm")
        if not HEADS[mlm.head].masked_lm:
            raise CompressError(f"--augment-mlm {mlm.path} has no masked-LM head (saved as {mlm.head}); "
                                "pass a masked-LM or pretraining model folder, or leave it out to use embedding neighbours")
        if mlm.tokenizer.get_vocab() != teacher.tokenizer.get_vocab():
            raise CompressError(f"--augment-mlm {mlm.path} has another vocabulary than the teacher; its candidates would be "
                                "other tokens. Pass a masked-LM made with the teacher's tokenizer")

        def masked_lm():
            return MaskedLMCandidates(load_folder_model(mlm, head="masked-lm"), teacher.tokenizer, k)

        return mlm, masked_lm
    if HEADS[teacher.folder.head].masked_lm:
        def teacher_mlm():
            return MaskedLMCandidates(load_folder_model(teacher.folder, head="masked-lm"), teacher.tokenizer, k)

        return teacher.folder, teacher_mlm

    def embedding_neighbours():
        return EmbeddingNeighbours.of_model(teacher.model, teacher.tokenizer, k)

    return teacher.folder, embedding_neighbours


def _transfer_sources(sources: tuple[str, ...], task, data: TaskData) -> tuple[list[list[str]], list[tuple[str, str]]]:
    """Documents (lists of sentences) from corpora, and ready-made pairs from pair tasks named ``task:NAME``."""
    documents, pairs, corpora = [], [], []
    for source in sources:
        if not source.startswith("task:"):
            corpora.append(source)
            continue
        other = get_task(source[len("task:"):])
        if other.name not in GLUE_TASKS:
            raise CompressError(f"--transfer-text {source}: only GLUE tasks' texts can be transferred, not {other.display}")
        ds = load_split(other, "train", DataSource(data_dir=data.data_dir))
        if len(other.text_fields) == 2 and len(task.text_fields) == 2:
            pairs += list(zip(ds[other.text_fields[0]], ds[other.text_fields[1]]))
        documents.append([text for f in other.text_fields for text in ds[f]])  # one document: no relation between rows
    if corpora:
        documents += read_documents(corpora)
    return documents, pairs


@dataclass
class _Trained:
    """What the stages of a task distillation produced, for the output's records."""

    history: list[dict] = field(default_factory=list)  # every stage's log, each entry tagged with its stage
    best: dict | None = None  # dev metrics of the best evaluation
    best_step: int | None = None
    seconds: float = 0.0
    cache: list[dict] = field(default_factory=list)  # one entry per stage that read the teacher cache
    processes: int = 1


def _stages(cfg: DistillConfig) -> list[tuple[str, tuple[str, ...], TrainConfig]]:
    """(name, terms, training config) per stage: TinyBERT's intermediate-then-prediction order, or one joint stage."""
    if not cfg.two_stage:
        return [("joint", cfg.losses, cfg.train)]
    intermediate = replace(cfg.train, epochs=cfg.intermediate_epochs) if cfg.intermediate_epochs else cfg.train
    return [("intermediate", tuple(t for t in cfg.losses if t in INTERMEDIATE_TERMS), intermediate),
            ("prediction", tuple(t for t in cfg.losses if t in PREDICTION_TERMS), cfg.train)]


def _train_stages(run: _Run, data: _TaskData, cfg, wrapper, evaluate, device) -> _Trained:
    """Train through every stage; the best dev weights (selected in the stages that predict) end in ``wrapper``."""
    task, teacher, student = run.task, run.teacher, run.student
    trained = _Trained()
    for stage, terms, stage_cfg in _stages(cfg):
        # TinyBERT runs both stages on the augmented set; by default only the prediction stage reads
        # it here, where the teacher's outputs are cached (the intermediate one runs the teacher alongside).
        gold_only = stage == "intermediate" and not cfg.extra_data.augment_intermediate
        features = data.gold_only() if gold_only else data.features
        lengths = [len(ids) for ids in features["input_ids"]]
        cache = _teacher_cache(run, terms, data, gold_only, cfg, device)
        if cache is not None:
            trained.cache.append({"stage": stage, "path": str(cache.path), "hit": cache.hit, "layers": list(cache.layers)})
        select = task.primary_metric if stage != "intermediate" else None
        result = train_keeping_best(
            wrapper, Phase(features, _collate_with_cache(data.pad), lengths=lengths), stage_cfg,
            loss_fn=make_loss_fn(task.behaviour, terms, cfg.loss, teacher.model, cache, student.pairs, apart=data.teacher_rows),
            work_dir=run.work / stage,
            evaluate=(lambda m: evaluate(m.student)) if select else None, select=select, resume=cfg.resume,
            run_key=[teacher.hash, task.name, data.n_train, len(features), data.max_length, list(terms), student.shape.label,
                     cfg.loss.layer_map],
            desc=f"distilling {task.display} ({stage})",
        )
        trained.history += [{**h, "stage": stage} for h in result.history]
        trained.seconds += result.seconds
        trained.processes = result.processes
        if result.best_weights is not None:
            trained.best, trained.best_step = result.best, result.best_step
    return trained


def _teacher_cache(run: _Run, terms, data: _TaskData, gold_only: bool, cfg: DistillConfig, device):
    """The teacher's outputs for ``terms`` on its own tokens (the stage's rows: ``gold_only`` or every one) cached on
    disk (computed on first use), or None: read them online."""
    needs = needs_of(terms)
    cacheable = {"logits"} | ({"hidden"} if cfg.cache_hidden else set())
    if not (cfg.cache and needs <= cacheable and "logits" in needs):  # hard labels alone need no teacher outputs
        return None
    features, pad = data.teacher_inputs(gold_only)
    with main_process_first():  # one process computes the teacher outputs, the others read them
        return load_or_build(
            run.teacher.model, run.teacher.hash, features, pad, outputs=list(run.task.behaviour.outputs),
            layers=sorted(teacher_layers(run.student.pairs, needs)), cache_dir=Path(cfg.cache_dir) if cfg.cache_dir else None,
            batch_size=cfg.data.eval_batch_size, device=device,
        )


def _collate_with_cache(pad):
    """``collate(items, step)``: a padded batch plus ``cache_index`` (batch,) and ``gold`` (batch,) bool; and, for a
    student with its own tokenizer, where it meets the teacher (word tasks: the teacher's positions (batch, seq);
    SQuAD: the teacher's row (batch,) and its start/end positions (batch, seq)), positions padded with -1."""
    def collate_step(items, step):
        index = [int(x["cache_index"]) for x in items]
        gold = [bool(x.get("gold", 1)) for x in items]
        batch = pad([{k: v for k, v in x.items() if k not in ("cache_index", "gold", *MEETING_COLUMNS)} for x in items])
        batch["cache_index"] = torch.tensor(index)
        batch["gold"] = torch.tensor(gold)
        side = getattr(getattr(pad, "tokenizer", None), "padding_side", "right")  # positions padded as the ids
        batch.update(meeting_batch(items, batch["input_ids"].shape[1], side))
        return batch

    return collate_step


def _task_metrics(task, data: _TaskData, trained: _Trained, teacher_dev: dict, cfg: DistillConfig) -> list[dict]:
    """metrics.json records of the student: dev scores, retention of the teacher's score, the training log."""
    teacher_metric = teacher_dev["metrics"].get(task.primary_metric)
    best = trained.best or {}
    records = split_records(task, data.dev, best, data=cfg.data.describe("dev"), max_length=data.max_length,
                            batch_size=cfg.data.eval_batch_size)
    primary = best.get(task.primary_metric)
    retention = {
        "kind": "retention", "task": task.name, "metric": task.primary_metric, "student": primary,
        "teacher": teacher_metric, "ratio": (primary / teacher_metric) if primary is not None and teacher_metric else None,
        "teacher_source": teacher_dev["source"], "teacher_at_chance": teacher_dev["check"]["at_chance"],
        "teacher_warning": teacher_dev["check"]["warning"], "when": utc_now(),
    }
    training = {
        "kind": "training", "stage": "distill", "task": task.name, "seconds": round(trained.seconds, 1),
        "best_step": trained.best_step, "n_train": data.n_train, "extra_rows": len(data.features) - data.n_train,
        "processes": trained.processes,
        "history": trained.history, "cache": trained.cache, "when": utc_now(),
    }
    return [*records, retention, training]


def _teacher_metrics(task, results: list[dict]) -> dict[str, float] | None:
    """The teacher's latest dev metrics on ``task`` recorded in its metrics.json (those of the primary split), or None."""
    for r in reversed(results):
        if r.get("kind") == "eval" and r.get("task") == task.name and r.get("split") in ("dev", "dev_matched"):
            metrics = r.get("metrics") or {}
            if metrics.get(task.primary_metric) is not None:
                return dict(metrics)
    return None
