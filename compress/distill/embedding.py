"""Sentence-embedding distillation: a smaller sentence-transformers model from a bigger one.

``distill_embedding(teacher, out, cfg)`` trains the student on unlabelled sentences (a
corpus, or a GLUE task's texts) to reproduce the teacher's pooled sentence embeddings
(MSE + cosine, :data:`EMBEDDING_TERMS`) and writes a folder ``SentenceTransformer(DIR)``
loads, with the teacher's pooling; ``--eval-tasks`` (pair tasks scored on the embeddings)
measure the student against the teacher.

A student with a tokenizer of its own (``--init DIR`` whose tokenizer is not the teacher's, e.g. a
MiniLM with BERT's WordPiece under an MPNet teacher; :mod:`compress.distill.cross_tokenizer`) needs
nothing more: the two meet per sentence. Each tokenises the sentence itself; the teacher's pooled
embedding of sentence i, computed once on its own tokens, is the target of the student's pooled
embedding of sentence i (its ``index``), and the student is evaluated and saved with its own tokenizer.
Every term compares pooled vectors, so none is refused.

A student narrower than the teacher (all-MiniLM-L6-v2, 384 wide, under all-mpnet-base-v2, 768 wide) stays a plain
sentence-transformers model of its own width, with no Dense layer: its per-sentence targets are the teacher's
embeddings reduced to its width by PCA fitted on the training sentences (:func:`pca_reduction`, as sentence-transformers'
model_distillation.py does), and the ``similarity`` term compares the in-batch cosine similarities of each side, the
teacher's at its full width. A wider student is refused.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from compress.distill import losses as L
from compress.core.formats.records import read_compression, read_metrics, utc_now
from compress.core.formats.writes import atomic_path
from compress.core.data.features import check_max_length, collate
from compress.core.data.sources import DataSource, load_split
from compress.core.errors import CompressError
from compress.core.registry import Registry
from compress.core.formats.sentence import (
    SentenceSpec,
    pooled,
    pooled_embeddings,
    prepare_texts,
    read_spec,
    staged_sentence_files,
)
from compress.core.model.structure import config_sizes
from compress.core.data.tasks import get_task
from compress.core.checkpoints import fingerprint, prepare_work_dir, work_dir_for
from compress.core.processes import is_main_process, main_process_first
from compress.core.train import Phase
from compress.distill.steps import (
    Student,
    Teacher,
    build_student,
    check_out,
    device_for,
    distill_record,
    open_teacher,
    student_tokenizer,
    train_keeping_best,
    write_student,
)
from compress.distill.config import EmbeddingDistillConfig
from compress.eval.embeddings import EMBEDDING_EVAL, embedding_record, embedding_scorer
from compress.eval.embeddings import primary_metric as embedding_primary_metric
from compress.eval.evaluate import format_table
from compress.teacher.corpus import read_documents
from compress.teacher.presets import open_model


# A sentence-embedding term of one sentence against its target: (student pooled (batch, d), teacher pooled (batch, d))
# -> scalar; the terms a static student (distill_static) takes too.
EMBEDDING_TERMS: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry("embedding distillation loss")
EMBEDDING_TERMS.register("mse", L.sentence_embedding_mse)
EMBEDDING_TERMS.register("cosine", L.sentence_embedding_cosine)


@dataclass(frozen=True)
class StudentTerm:
    """A term of distill-embedding's student: ``compute(student (batch, d_s), teacher (batch, d)) -> scalar``."""

    compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    weight: str  # the config field that weighs it
    full_width: bool = False  # it reads the teacher's own embeddings, not its targets at the student's width


# distill-embedding's terms: the per-sentence ones (against targets at the student's width) and similarity, which
# compares the sentences of a batch with each other on each side, so reads the teacher at its own width.
STUDENT_TERMS: Registry[StudentTerm] = Registry("embedding distillation loss")
STUDENT_TERMS.register("mse", StudentTerm(EMBEDDING_TERMS.get("mse"), "mse_weight"))
STUDENT_TERMS.register("cosine", StudentTerm(EMBEDDING_TERMS.get("cosine"), "cosine_weight"))
STUDENT_TERMS.register("similarity", StudentTerm(L.sentence_similarity_mse, "similarity_weight", full_width=True))


def distill_embedding(teacher: str | Path, out: str | Path, cfg: EmbeddingDistillConfig, *, overwrite: bool = False) -> Path:
    """Distil a sentence-embedding model into a smaller one on unlabelled sentences (Reimers & Gurevych 2020).

    The student (``cfg.student``, by default made of teacher layers) learns to reproduce
    the teacher's pooled embedding of every sentence: MSE on the pooled vectors (before
    normalisation) plus 1 - cosine, weighted. The teacher's embeddings are computed once
    before training and kept with the checkpoints (``--resume`` reuses them). The teacher
    is a sentence-transformers folder or any BERT encoder (mean pooling); the output is a
    sentence-transformers folder with the teacher's pooling, normalisation and
    ``max_seq_length``, which ``SentenceTransformer(out)`` loads. A student from ``--init DIR``
    with a tokenizer of its own reads (and is saved with) that tokenizer; the targets stay the
    teacher's embeddings on its own tokens, met per sentence. A narrower student keeps its width: its
    per-sentence targets are the teacher's embeddings reduced by PCA (:func:`pca_reduction`).
    """
    out = check_out(out, cfg, overwrite, teacher)
    folder = open_model(teacher).check_torch("embedding distillation (the teacher)")
    spec = read_spec(folder.path)
    teach = open_teacher(folder, "base", set())
    student = build_student(teach, cfg, set(), tokenizer=student_tokenizer(teach, cfg))  # its own, or the teacher's
    width, teacher_width = config_sizes(student.model.config).hidden, config_sizes(teach.model.config).hidden
    if width > teacher_width:
        raise CompressError(
            f"the student's hidden width {width} is more than the teacher's {teacher_width}: its targets can only be "
            f"reduced (by PCA), not widened; choose a student at most {teacher_width} wide (e.g. --student 3L-{teacher_width})")
    check_max_length(cfg.max_length, min(config_sizes(teach.model.config).max_positions,
                                         config_sizes(student.model.config).max_positions))
    sentences, sources = embedding_sentences(cfg)
    n_held = min(cfg.heldout_sentences, len(sentences) // 10)
    if width < teacher_width and len(sentences) - n_held <= width:
        raise CompressError(
            f"reducing the teacher's {teacher_width}-wide embeddings to the student's {width} by PCA needs more than {width} "
            f"training sentences, and there are {len(sentences) - n_held}: add text (or raise --max-sentences)")
    device = device_for(teach, cfg.train.device)
    work = prepare_work_dir(work_dir_for(out), cfg.resume)
    full, teacher_seconds = _teacher_targets(teach, spec, sentences, cfg, work, device)  # (n, d_t) pooled, on the CPU
    # Fitted on the training sentences only, so the held-out loss reads sentences the PCA never saw.
    reduction = pca_reduction(full[n_held:], width) if width < teacher_width else None
    targets = full if reduction is None else reduction.apply(full)  # (n, d_s): what mse and cosine compare with
    features = _sentence_features(student.tokenizer, sentences, spec, cfg.max_length)  # row i: targets[i]
    held, train_set = features[:n_held], features[n_held:]
    collate_step = _sentence_collator(student.tokenizer)
    loss_fn = _embedding_loss_fn(cfg, targets, spec.pooling, full=full)
    own_spec = _student_spec(spec, student)  # the folder's files as the student's folder carries them
    scorers = embedding_scorers(cfg, student.tokenizer, own_spec)  # the student's: the teacher is scored with its own
    held_batches = [collate_step(held[i : i + 64], 0) for i in range(0, len(held), 64)]
    evaluate = _embedding_evaluator(loss_fn, held_batches, scorers, device) if held_batches or scorers else None
    before = evaluate(student.model.to(device)) if evaluate is not None and is_main_process() else None
    result = train_keeping_best(
        student.model, Phase(train_set, collate_step, lengths=[len(x["input_ids"]) for x in train_set], name="sentences"),
        cfg.train, loss_fn=loss_fn, work_dir=work, evaluate=evaluate, select="neg_heldout_loss" if held_batches else None,
        resume=cfg.resume, run_key=[teach.hash, len(train_set), n_held, student.shape.label, list(cfg.losses), cfg.max_length],
        desc="embedding distillation",
    )
    if not is_main_process():
        return out
    training = {
        "kind": "training", "stage": "distill-embedding", "steps": result.steps, "seconds": round(result.seconds, 1),
        "teacher_seconds": round(teacher_seconds, 1), "processes": result.processes, "sentences": len(train_set),
        "heldout": n_held, "sources": sources, "before": before, "best": result.best, "best_step": result.best_step,
        "history": result.history, "when": utc_now(),
    }
    metrics = [*_embedding_task_records(scorers, student, teach, spec, cfg), training]
    record = distill_record("distill-embedding", cfg, teach, student, losses=list(cfg.losses), terms=_terms_record(cfg),
                            targets=_targets_record(reduction, teacher_width),
                            sentence={"pooling": spec.pooling, "normalize": spec.normalize, "max_seq_length": own_spec.max_seq_length})
    stage, files = staged_sentence_files(own_spec, width)
    with stage:
        return write_student(student, out, teach, record, metrics, resume=cfg.resume, overwrite=overwrite, work=work, files=files)


def _student_spec(spec: SentenceSpec, student: Student) -> SentenceSpec:
    """The teacher's sentence files as the student's folder carries them: the same, but for a student with its own
    tokenizer, a ``max_seq_length`` no longer than its position embeddings take."""
    limit = config_sizes(student.model.config).max_positions
    if student.apart and spec.max_seq_length and spec.max_seq_length > limit:
        return replace(spec, max_seq_length=limit)
    return spec


def embedding_sentences(cfg: EmbeddingDistillConfig) -> tuple[list[str], dict[str, int]]:
    """Distinct sentences of the corpus and of the GLUE tasks' training splits, in a seeded random order.

    Returns the sentences (capped at ``max_sentences`` plus the held-out ones) and how many
    distinct sentences each source gave.
    """
    seen: dict[str, None] = {}
    sources: dict[str, int] = {}

    def add(name: str, texts) -> None:
        before = len(seen)
        for text in texts:
            text = " ".join(str(text).split())
            if len(text.split()) >= cfg.min_words:
                seen.setdefault(text)
        sources[name] = len(seen) - before

    if cfg.corpus:
        add("corpus", (s for doc in read_documents(list(cfg.corpus)) for s in doc))
    for name in cfg.sentences_from:
        task = get_task(name)
        ds = load_split(task, "train", DataSource(data_dir=cfg.data_dir))
        add(task.name, (text for f in task.text_fields for text in ds[f]))
    sentences = list(seen)
    if len(sentences) < 2:
        raise CompressError(f"only {len(sentences)} sentences of at least {cfg.min_words} words found; add text")
    random.Random(cfg.train.seed).shuffle(sentences)
    if cfg.max_sentences is not None:
        sentences = sentences[: cfg.max_sentences + min(cfg.heldout_sentences, cfg.max_sentences // 9)]
    return sentences, sources


def _teacher_targets(teach: Teacher, spec: SentenceSpec, sentences: list[str], cfg: EmbeddingDistillConfig, work: Path,
                     device) -> tuple[torch.Tensor, float]:
    """The teacher's pooled embeddings of every sentence, ``(n, d)`` on the CPU, and the seconds they took.

    Computed once (rank 0 first) and kept in the work directory under a key of teacher,
    sentences and length, so a resumed run reads them instead.
    """
    digest = hashlib.sha256("\n".join(sentences).encode()).hexdigest()
    key = fingerprint(teach.hash, spec.pooling, spec.do_lower_case, cfg.max_length, digest)
    file = work / f"teacher-embeddings-{key}.safetensors"
    started = time.monotonic()
    with main_process_first():
        if not file.is_file():
            targets = pooled(teach.model, teach.tokenizer, sentences, spec, batch_size=cfg.teacher_batch_size,
                             max_length=cfg.max_length, device=device, desc="teacher embeddings")
            if is_main_process():
                with atomic_path(file) as tmp:
                    save_file({"embeddings": targets.contiguous()}, str(tmp))
        targets = load_file(str(file))["embeddings"]
    return targets, time.monotonic() - started


@dataclass(frozen=True)
class Reduction:
    """The teacher's embeddings reduced to a narrower student's width: a PCA of them (:func:`pca_reduction`)."""

    components: torch.Tensor  # (k, d) float64, orthonormal rows: the top-k principal directions, by decreasing variance
    mean: torch.Tensor  # (d,) float64: the teacher's mean embedding over the sentences fitted on
    variance_kept: float  # the share of the teacher's variance (around its mean) the k directions hold
    fitted_on: int  # sentences

    def apply(self, embeddings: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
        """The targets of embeddings ``(n, d)``: ``(n, k)``, ``e @ components.T``, in the embeddings' dtype.

        That is ``(e - mean) @ components.T + mean @ components.T``: the teacher's embedding projected orthogonally
        onto the kept directions, its mean added back and nothing rescaled (as the bias-free Dense of the PCA
        components in sentence-transformers' model_distillation.py). Why not the centred coordinates alone: the
        cosine similarity STS and retrieval read is taken on the raw embeddings, mean included. An orthogonal
        projection keeps every inner product within the kept subspace, so cos(t_i, t_j) departs from the teacher's
        only by what the dropped directions held (the mean's part outside the subspace among them: ``mean_kept``
        records how much of it stays); centring would drop the mean's projection too and move every cosine by it
        (with a mean offset of the embeddings' own size, the rank agreement of all pairs' cosines with the teacher's
        fell from ~0.99 to ~0.75-0.9 in a synthetic check). And with no rescaling, lengths and distances along the
        kept directions are the teacher's: mse reads the teacher's own errors in its units, and a folder without
        Normalize keeps the teacher's dot-product scale.
        """
        return torch.cat([(rows.double() @ self.components.T).to(embeddings.dtype) for rows in embeddings.split(chunk)])

    def record(self) -> dict[str, Any]:
        """What compression.json says of it (under ``targets``)."""
        norm = float(self.mean.pow(2).sum())
        kept_mean = float((self.components @ self.mean).pow(2).sum()) / norm if norm else 1.0
        return {"reduction": "pca", "components": self.components.shape[0], "fitted_on": self.fitted_on,
                "variance_kept": round(self.variance_kept, 6), "mean_kept": round(kept_mean, 6),
                "targets": "e @ components.T: the teacher's embedding projected onto its top principal directions "
                           "(fitted around its mean on the training sentences), the mean kept, not rescaled"}


def pca_reduction(embeddings: torch.Tensor, k: int, chunk: int = 65536) -> Reduction:
    """PCA of the teacher's embeddings ``(n, d)``: their mean and top-``k`` principal directions, in float64.

    The covariance is summed chunk by chunk (float64 memory O(d²), not O(n·d)) and diagonalised; each direction's sign
    is fixed so that its largest coordinate in magnitude is positive (scikit-learn's svd_flip on V), so the same
    embeddings always give the same targets.
    """
    n, d = embeddings.shape
    if not 0 < k < min(n, d + 1):
        raise CompressError(f"PCA of {n} embeddings {d} wide cannot keep {k} directions: it needs more than {k} sentences "
                            f"and at most {d} directions")
    mean = sum(rows.double().sum(0) for rows in embeddings.split(chunk)) / n  # (d,)
    cov = torch.zeros(d, d, dtype=torch.float64)
    for rows in embeddings.split(chunk):
        centred = rows.double() - mean  # (chunk, d)
        cov += centred.T @ centred
    values, vectors = torch.linalg.eigh(cov)  # ascending; columns are the directions
    values = values.clamp_min(0.0)
    if float(values.sum()) == 0.0:
        raise CompressError(f"the teacher gives all {n} training sentences the same embedding: PCA has no direction to keep")
    top = vectors[:, -k:].flip(-1).T  # (k, d), by decreasing variance
    pivot = top.abs().argmax(dim=1, keepdim=True)  # (k, 1)
    top = top * torch.sign(top.gather(1, pivot))
    return Reduction(top.contiguous(), mean, float(values[-k:].sum() / values.sum()), n)


def _targets_record(reduction: Reduction | None, teacher_width: int) -> dict[str, Any]:
    """compression.json's ``targets``: the teacher's width, and how its embeddings were reduced (if they were)."""
    return {"teacher_width": teacher_width, **(reduction.record() if reduction is not None else {"reduction": None})}


def _sentence_features(tokenizer, sentences: list[str], spec: SentenceSpec, max_length: int) -> list[dict]:
    """One item per sentence: its token ids (as SentenceTransformer tokenises it) and its row of the targets."""
    enc = tokenizer(prepare_texts(sentences, spec), truncation=True, max_length=max_length)
    names = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
    return [{**{k: enc[k][i] for k in names}, "index": i} for i in range(len(sentences))]


def _sentence_collator(tokenizer):
    """``collate(items, step)``: padded sentences plus ``index`` (batch,), their rows of the teacher targets."""
    pad = collate(tokenizer)

    def collate_step(items, step):
        batch = dict(pad([{k: v for k, v in x.items() if k != "index"} for x in items]))
        batch["index"] = torch.tensor([x["index"] for x in items])
        return batch

    return collate_step


def _embedding_loss_fn(cfg: EmbeddingDistillConfig, targets: torch.Tensor, pooling: str, full: torch.Tensor | None = None):
    """``loss_fn(model, batch) -> (loss, logs)``: the weighted embedding terms against the teacher's pooled vectors.

    ``targets``: ``(n, d_s)``, the per-sentence terms' (the teacher's embeddings, PCA-reduced for a narrower student);
    ``full``: ``(n, d_t)``, the teacher's own, which a full-width term (similarity) reads (None: ``targets`` are them).
    """
    terms = {t: STUDENT_TERMS.get(t) for t in cfg.losses}
    weights = {t: getattr(cfg, term.weight) for t, term in terms.items()}
    sources = {False: targets, True: targets if full is None else full}
    wanted = {term.full_width for term in terms.values()}

    def loss_fn(model, batch):
        index = batch.pop("index").cpu()
        student = pooled_embeddings(model, batch, pooling)  # (batch, d_s)
        # (batch, d_s) targets and/or (batch, d_t) full-width rows, as the terms read them
        teacher = {w: sources[w][index].to(device=student.device, dtype=student.dtype) for w in wanted}
        parts = {t: term.compute(student, teacher[term.full_width]) for t, term in terms.items()}
        total = sum(weights[t] * parts[t] for t in cfg.losses)
        return total, {f"loss_{t}": v.detach() for t, v in parts.items()}

    return loss_fn


def _terms_record(cfg: EmbeddingDistillConfig) -> dict[str, dict]:
    """compression.json's ``terms``: each term's weight and what it compares the student's embeddings with."""
    reads = {False: "the teacher's embedding of the same sentence, at the student's width",
             True: "the teacher's in-batch cosine similarities, at its own width"}
    return {t: {"weight": getattr(cfg, STUDENT_TERMS.get(t).weight), "against": reads[STUDENT_TERMS.get(t).full_width]}
            for t in cfg.losses}


def embedding_scorers(cfg: EmbeddingDistillConfig, tokenizer, spec: SentenceSpec) -> dict[str, tuple[Any, Any]]:
    """Per eval task: (task, its dev split's scorer), planned once."""
    scorers = {}
    for name in cfg.eval_tasks:
        task = get_task(name)
        ds = load_split(task, "dev", DataSource(data_dir=cfg.data_dir))
        scorers[task.name] = (task, ds, embedding_scorer(tokenizer, task, ds, spec, batch_size=64))
    return scorers


def _embedding_evaluator(loss_fn, batches: list[dict], scorers: dict, device):
    """``evaluate(model)``: held-out loss per term (and its negation, to select by); each eval task's metrics."""
    def evaluate(model) -> dict[str, float]:
        sums: dict[str, float] = {}
        n = 0
        with torch.inference_mode():
            for batch in batches:
                batch = {k: v.to(device) for k, v in batch.items()}  # a copy: loss_fn pops from it
                loss, logs = loss_fn(model, batch)
                size = len(batch["input_ids"])
                for key, value in {"loss": loss, **logs}.items():
                    name = "heldout_" + key.removeprefix("loss_")
                    sums[name] = sums.get(name, 0.0) + float(value) * size
                n += size
        out = {k: v / n for k, v in sums.items()} if n else {}
        if n:
            out["neg_heldout_loss"] = -out["heldout_loss"]
        for name, (_, _, score) in scorers.items():
            out.update({f"{name}/{k}": v for k, v in score(model)[0].items()})
        return out

    return evaluate


def _embedding_task_records(scorers: dict, student: Student, teach: Teacher, spec: SentenceSpec, cfg) -> list[dict]:
    """Per eval task: the student's dev record and its retention of the teacher's primary metric (the teacher's
    score on its own tokens: ``scorers`` tokenise as the student does)."""
    student_model, apart = student.model, student.apart
    records = []
    for name, (task, ds, score) in scorers.items():
        metrics, details = score(student_model)
        records.append(embedding_record(task, "dev", len(ds), metrics, details, spec, data=cfg.data_dir or "the Hugging Face hub"))
        primary = embedding_primary_metric(task)
        teacher_score = score if not apart else embedding_scorer(teach.tokenizer, task, ds, spec, batch_size=64)
        teacher_value = teacher_embedding_score(teach, task, primary, teacher_score)
        records.append({
            "kind": "retention", "task": task.name, "metric": primary, "embedding": True, "student": metrics[primary],
            "teacher": teacher_value, "ratio": metrics[primary] / teacher_value if teacher_value else None, "when": utc_now(),
        })
    return records


def teacher_embedding_score(teach: Teacher, task, metric: str, score) -> float | None:
    """The teacher's dev score on ``task``'s embeddings: from its metrics.json when recorded, else measured now."""
    for r in reversed(read_metrics(teach.folder.path)):
        if r.get("kind") == EMBEDDING_EVAL and r.get("task") == task.name and r.get("split") == "dev":
            value = (r.get("metrics") or {}).get(metric)
            if value is not None:
                return float(value)
    return score(teach.model)[0].get(metric)


def summarize_embedding(out: Path, cfg: EmbeddingDistillConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress distill-embedding`` prints: held-out loss before/after, eval tasks, retention."""
    results = read_metrics(out)
    lines = []
    evals = [r for r in results if r.get("kind") == EMBEDDING_EVAL]
    if evals:
        lines.append(format_table(evals))
    training = next((r for r in results if r.get("kind") == "training"), {})
    before, best = training.get("before") or {}, training.get("best") or {}
    for term in cfg.losses:
        key = f"heldout_{term}"
        if key in before and key in best:
            lines.append(f"held-out {term}: {before[key]:.4f} at the start -> {best[key]:.4f} (best, step {training.get('best_step')})")
    targets = read_compression(out).get("targets") or {}
    if targets.get("reduction") == "pca":
        lines.append(f"targets: the teacher's {targets['teacher_width']}-wide embeddings reduced to {targets['components']} "
                     f"by PCA on {targets['fitted_on']} sentences, keeping {100 * targets['variance_kept']:.1f}% of their variance")
    for r in results:
        if r.get("kind") == "retention" and r.get("ratio") is not None:
            lines.append(f"retention: {r['student']:.2f} / {r['teacher']:.2f} = {100 * r['ratio']:.1f}% of the teacher's {r['task']} {r['metric']}")
    return "\n".join(lines), []
