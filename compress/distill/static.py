"""Static-embedding distillation: a model2vec student, one vector per token, from a sentence-embedding teacher.

``distill_static(teacher, out, cfg)`` builds the student with model2vec (the ``static`` extra):
every token of the teacher's vocabulary is embedded by the teacher, the vectors are
PCA-reduced (``--pca-dims``) and weighted by SIF on Zipf-estimated frequencies
(``--sif-coefficient``); a sentence is the normalised mean of its tokens' vectors. Given
sentences (``--corpus`` / ``--sentences-from``, gathered as distill-embedding gathers them),
the table is then refined so that those means point where the teacher's sentence embeddings
do (:func:`refine`). The folder loads in ``model2vec.StaticModel.from_pretrained``,
``SentenceTransformer`` and every loader here (``compress.core.formats.static``).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from compress.core.formats.artifacts import load_tokenizer, output_dir
from compress.core.formats.layout import COMPRESSION_FILE, METRICS_FILE, STATIC
from compress.core.formats.records import compression_record, read_compression, read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.preflight import check_output
from compress.core.errors import CompressError
from compress.core.logs import errors_only, progress
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import SentenceSpec, pooled, read_spec
from compress.core.formats.static import structure as static_structure
from compress.core.model.structure import config_sizes
from compress.core.checkpoints import prepare_work_dir, work_dir_for
from compress.core.processes import is_main_process
from compress.core.train import Phase
from compress.distill.embedding import (
    EMBEDDING_TERMS,
    embedding_scorers,
    embedding_sentences,
    teacher_embedding_score,
)
from compress.distill.config import StaticDistillConfig
from compress.distill.steps import Teacher, device_for, open_teacher, train_keeping_best
from compress.eval.embeddings import EMBEDDING_EVAL, embedding_record, embedding_scorer
from compress.eval.embeddings import primary_metric as embedding_primary_metric
from compress.eval.evaluate import format_table
from compress.teacher.presets import open_model

log = logging.getLogger(__name__)

EXTRA = "pip install 'compress[static]'"  # what installs model2vec (and skeletoken, its tokenizer surgery)


def distill_static(teacher: str | Path, out: str | Path, cfg: StaticDistillConfig, *, overwrite: bool = False) -> Path:
    """Distil a sentence-embedding teacher into a model2vec static model, refined on sentences when given.

    A linear sequence of steps: check, open the teacher, plan the data, build the table with
    model2vec, refine it, write the folder (model2vec's files, compression.json, metrics.json,
    the evaluation of ``--eval-tasks`` made on the written folder).
    """
    out = check_output(out, overwrite, inputs=((teacher,), cfg))
    folder = open_model(teacher).check_torch("static distillation (the teacher)")
    m2v = model2vec()
    spec = read_spec(folder.path)
    teach = open_teacher(folder, "base", set())
    width = config_sizes(teach.model.config).hidden
    if cfg.pca_dims is not None and cfg.pca_dims > width:
        raise CompressError(f"--pca-dims {cfg.pca_dims} is more than the teacher's width {width}: PCA cannot add "
                            f"dimensions; choose at most {width}, or none")
    scorers = embedding_scorers(cfg, teach.tokenizer, spec)  # the eval data is read now: a missing file fails first
    sentences, sources = embedding_sentences(cfg) if cfg.refining else ([], {})
    device = device_for(teach, cfg.train.device)
    static, projection, built = build_static(m2v, teach, cfg, device)
    refinement, training = refine(static, projection, teach, spec, sentences, cfg, device=device, out=out) if sentences else (None, None)
    if training is not None:
        training["sources"] = sources
    if not is_main_process():
        return out
    record = compression_record(
        stage="distill-static", method="model2vec" + ("+refined" if refinement and refinement["kept"] else ""),
        config=cfg, parent=teach.folder, structure=static_structure(*static.embedding.shape), seed=cfg.train.seed,
        extra={"format": STATIC, "precision": "fp32", "teacher": {"path": str(folder.path), "hash": teach.hash},
               "static": built, "sources": sources, "refinement": refinement, "params": int(static.embedding.size),
               "sentence": {"pooling": "mean", "normalize": True, "max_seq_length": static.max_length}})
    with output_dir(out, overwrite) as tmp:
        m2v.save_pretrained(folder_path=tmp, embeddings=static.embedding, tokenizer=static.tokenizer, config=static.config,
                            create_model_card=False)  # the toolkit's card, written from the records, replaces it
        write_json_atomic(tmp / COMPRESSION_FILE, record)
        metrics = [*_task_records(tmp, scorers, teach, cfg), *([training] if training else [])]
        write_json_atomic(tmp / METRICS_FILE, {"results": metrics})
    return out


def model2vec() -> SimpleNamespace:
    """The parts of model2vec this stage uses; its absence is one line naming the extra that installs it."""
    try:
        # deferred: an optional dependency (the static extra), imported by this stage only
        import model2vec as package
        # deferred: an optional dependency, as above
        from model2vec.distill import distill_from_model
        # deferred: an optional dependency, as above
        from model2vec.distill.inference import apply_pca, compute_weights
        # deferred: an optional dependency, as above
        from model2vec.persistence import save_pretrained
    except ImportError as err:
        raise CompressError(f"compress distill-static builds on model2vec, which cannot be imported here ({err}); {EXTRA}") from None
    return SimpleNamespace(version=package.__version__, StaticModel=package.StaticModel, distill_from_model=distill_from_model,
                           apply_pca=apply_pca, compute_weights=compute_weights, save_pretrained=save_pretrained)


def build_static(m2v: SimpleNamespace, teach: Teacher, cfg: StaticDistillConfig, device: torch.device):
    """model2vec's static model of the teacher, and the affine map of its PCA (teacher space -> static space).

    model2vec embeds every token (``distill_from_model``, run without PCA and weighting so the
    raw vectors stay at hand), then the same two steps ``distill_from_model`` ends with: its
    PCA and its SIF weights (a test holds the result equal to a plain ``distill_from_model``).
    The PCA's map is recovered from its input and output by least squares (exact up to
    rounding: it is affine), so teacher sentence embeddings can be projected alike.
    Returns (StaticModel, (P (d, k), b (k,)) float32 tensors, what compression.json records).
    """
    started = time.monotonic()
    teach.model.name_or_path = str(teach.folder.path)  # model2vec names its base model from it; a path is never looked up online
    log.info("model2vec: the teacher embeds each of its %d tokens", len(teach.tokenizer))
    with _quiet_skeletoken(), _model2vec_bars():
        raw = m2v.distill_from_model(teach.model, teach.tokenizer, pca_dims=None, sif_coefficient=None,
                                     token_remove_pattern=cfg.token_remove_pattern, quantize_to="float32", device=str(device))
    tokens = raw.embedding  # (vocabulary, d) float32: each token through the teacher, as distill_from_model has it
    if cfg.pca_dims is not None and cfg.pca_dims >= len(tokens):
        raise CompressError(f"--pca-dims {cfg.pca_dims} needs more tokens than that, and the vocabulary has {len(tokens)}; "
                            "choose fewer dimensions, or none")
    reduced = m2v.apply_pca(tokens, cfg.pca_dims)  # (vocabulary, k)
    weights = m2v.compute_weights(len(tokens), sif_coefficient=cfg.sif_coefficient)  # (vocabulary,)
    vectors = (reduced * weights[:, None]).astype(np.float32)
    inputs = np.hstack([tokens, np.ones((len(tokens), 1))]).astype(np.float64)  # (vocabulary, d + 1)
    affine, *_ = np.linalg.lstsq(inputs, reduced.astype(np.float64), rcond=None)  # (d + 1, k)
    error = float(np.abs(inputs @ affine - reduced).max() / max(np.abs(reduced).max(), 1e-12))
    config = {**raw.config, "apply_pca": cfg.pca_dims, "sif_coefficient": cfg.sif_coefficient, "hidden_dim": vectors.shape[1]}
    static = m2v.StaticModel(vectors=vectors, tokenizer=raw.tokenizer, config=config, normalize=True,
                             base_model_name=raw.base_model_name, language=raw.language)
    projection = (torch.from_numpy(affine[:-1]).float(), torch.from_numpy(affine[-1]).float())
    built = {"model2vec": m2v.version, "vocabulary": len(tokens), "teacher_width": tokens.shape[1],
             "pca_dims": cfg.pca_dims, "dimension": vectors.shape[1], "sif_coefficient": cfg.sif_coefficient,
             "token_remove_pattern": cfg.token_remove_pattern, "pca_fit_error": error,
             "seconds": round(time.monotonic() - started, 1)}
    _zero_unknown(static)
    log.info("static table: %d tokens x %d (teacher width %d) in %.0f s", len(vectors), vectors.shape[1], tokens.shape[1],
             built["seconds"])
    return static, projection, built


def _zero_unknown(static) -> None:
    """Zero the unknown token's vector: model2vec leaves that token out of a sentence's mean, sentence-transformers
    averages it in; with a zero vector the two give the same normalised embedding."""
    unk = static.unk_token_id
    if unk is not None and 0 <= unk < len(static.embedding):
        static.embedding[unk] = 0.0


def _quiet_skeletoken():
    """Errors only from skeletoken's tokenizer conversion for the block: it warns that a toolkit tokenizer.json has
    no padding set, which the toolkit clears on save by design (noise to a user)."""
    return errors_only(logging.getLogger("skeletoken.transformers_compat"))


@contextlib.contextmanager
def _model2vec_bars() -> Iterator[None]:
    """model2vec draws its bar over the vocabulary with tqdm whatever the settings; the toolkit's bars show on a
    terminal only (compress.core.logs), so its module's tqdm is the toolkit's ``progress`` for the block."""
    module = sys.modules["model2vec.distill.inference"]
    saved = module.tqdm
    module.tqdm = progress
    try:
        yield
    finally:
        module.tqdm = saved


# ---------------------------------------------------------------------------- refinement


class StaticMean(nn.Module):
    """The table being refined: a sentence is the mean of its tokens' vectors (model2vec's encode, before normalising)."""

    def __init__(self, vectors: np.ndarray):
        super().__init__()
        self.vectors = nn.Parameter(torch.tensor(vectors, dtype=torch.float32))  # (tokens, k)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(batch, L) token ids and their mask (1: a token, 0: padding) -> (batch, k) means."""
        rows = self.vectors[ids] * mask.unsqueeze(-1)  # (batch, L, k)
        return rows.sum(dim=1) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)


def refine(static, projection: tuple[torch.Tensor, torch.Tensor], teach: Teacher, spec: SentenceSpec,
           sentences: list[str], cfg: StaticDistillConfig, *, device: torch.device, out: Path) -> tuple[dict, dict]:
    """Refine ``static``'s table in place so that each sentence's mean token vector points where the teacher's embedding does.

    A sentence's target is the teacher's pooled embedding through the PCA's affine map,
    normalised, at the length the sentence's mean had before refinement: the mse term then
    corrects directions and leaves the lengths SIF gave the tokens (their weights in the mean),
    the cosine term reads directions only. The table trains divided by one number (multiplied
    back after) that gives its sentences' means a root-mean-square of 1 per dimension, so the
    learning rate means the same whatever the teacher, vocabulary, SIF and width, and the two
    terms weigh about alike. AdamW through the toolkit's training loop; the
    held-out sentences (the first of the seeded order) give the loss before training and after
    each epoch; the best epoch is kept, and the unrefined table when no epoch beats it.
    Returns (compression.json's refinement record, metrics.json's training record).
    """
    rows = static.tokenize(sentences)  # as model2vec's encode tokenises: no special tokens, the unknown token left out
    items = [{"ids": ids, "index": i} for i, ids in enumerate(r for r in rows if r)]
    texts = [s for s, r in zip(sentences, rows) if r]
    if not items:
        raise CompressError(f"none of the {len(sentences)} sentences has a token of the static vocabulary; refine on "
                            "text in the teacher's language")
    started = time.monotonic()
    targets = pooled(teach.model, teach.tokenizer, texts, spec, batch_size=cfg.teacher_batch_size, device=device,
                     desc="teacher embeddings")  # (n, d), before any normalisation
    teacher_seconds = time.monotonic() - started
    model = StaticMean(static.embedding)
    with torch.no_grad():
        lengths = torch.cat([model(*_collate(items[i : i + 512], 0)[:2]) for i in range(0, len(items), 512)]).norm(dim=-1)
        # Trained at a root-mean-square of 1 per dimension in the sentence means: --lr means the same for any teacher,
        # vocabulary, SIF and width, and mse (per dimension) weighs about twice 1 - cos (outputs are normalised anyway).
        scale = float(lengths.mean().clamp(min=1e-12)) / model.vectors.shape[1] ** 0.5
        model.vectors /= scale
    weight, bias = projection
    goal = F.normalize(targets @ weight + bias, dim=-1) * (lengths / scale).unsqueeze(-1)  # (n, k)
    n_held = min(cfg.heldout_sentences, len(items) // 10)
    held, train_items = items[:n_held], items[n_held:]
    loss_fn = _loss_fn(cfg, goal)
    evaluate = _heldout(loss_fn, [_collate(held[i : i + 256], 0) for i in range(0, n_held, 256)]) if n_held else None
    before = evaluate(model) if evaluate is not None else None
    work = prepare_work_dir(work_dir_for(out), resume=False)
    result = train_keeping_best(
        model, Phase(train_items, _as_batch, lengths=[len(x["ids"]) for x in train_items], name="sentences"), cfg.train,
        loss_fn=loss_fn, work_dir=work, evaluate=evaluate, select="neg_heldout_loss" if evaluate else None,
        run_key=[teach.hash, len(train_items), n_held, list(cfg.losses)], desc="static refinement")
    shutil.rmtree(work, ignore_errors=True)
    kept = before is None or (result.best is not None and result.best["heldout_loss"] < before["heldout_loss"])
    if kept:
        static.embedding = (model.vectors.detach().cpu() * scale).numpy().astype(np.float32)  # back at model2vec's scale
        _zero_unknown(static)
    refinement = {"sentences": len(train_items), "heldout": n_held, "without_tokens": len(sentences) - len(items),
                  "losses": list(cfg.losses), "scale": scale, "before": before, "after": result.best,
                  "best_step": result.best_step, "steps": result.steps, "kept": kept}
    training = {"kind": "training", "stage": "distill-static", "steps": result.steps, "seconds": round(result.seconds, 1),
                "teacher_seconds": round(teacher_seconds, 1), "processes": result.processes, "sentences": len(train_items),
                "heldout": n_held, "before": before, "best": result.best, "best_step": result.best_step, "kept": kept,
                "history": result.history, "when": utc_now()}
    return refinement, training


def _collate(items: list[dict], step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids (batch, L) padded with 0, their mask (batch, L) float, and ``index`` (batch,): the rows of the targets."""
    longest = max(len(x["ids"]) for x in items)
    ids = torch.zeros(len(items), longest, dtype=torch.long)
    mask = torch.zeros(len(items), longest)
    for row, item in enumerate(items):
        ids[row, : len(item["ids"])] = torch.tensor(item["ids"])
        mask[row, : len(item["ids"])] = 1.0
    return ids, mask, torch.tensor([x["index"] for x in items])


def _as_batch(items: list[dict], step: int) -> dict[str, torch.Tensor]:
    """The training loop's form of :func:`_collate`: a dict of tensors."""
    return dict(zip(("ids", "mask", "index"), _collate(items, step)))


def _loss_fn(cfg: StaticDistillConfig, goal: torch.Tensor):
    """``loss_fn(model, batch) -> (loss, logs)``: the weighted terms of the batch's means against their targets."""
    weights = {"mse": cfg.mse_weight, "cosine": cfg.cosine_weight}

    def loss_fn(model, batch):
        index = batch.pop("index")
        student = model(batch["ids"], batch["mask"])  # (batch, k)
        target = goal[index.cpu()].to(student.device)  # (batch, k)
        parts = {t: EMBEDDING_TERMS.get(t)(student, target) for t in cfg.losses}
        return sum(weights[t] * parts[t] for t in cfg.losses), {f"loss_{t}": v.detach() for t, v in parts.items()}

    return loss_fn


def _heldout(loss_fn, batches: list[tuple[torch.Tensor, ...]]):
    """``evaluate(model)``: the held-out loss and each term's (and the loss negated, to select by)."""
    def evaluate(model) -> dict[str, float]:
        sums: dict[str, float] = {}
        with torch.no_grad():
            for ids, mask, index in batches:
                device = model.vectors.device
                loss, logs = loss_fn(model, {"ids": ids.to(device), "mask": mask.to(device), "index": index})
                for key, value in {"loss": loss, **logs}.items():
                    name = "heldout_" + key.removeprefix("loss_")
                    sums[name] = sums.get(name, 0.0) + float(value) * len(ids)
        n = sum(len(ids) for ids, _, _ in batches)
        out = {k: v / n for k, v in sums.items()}
        return {**out, "neg_heldout_loss": -out["heldout_loss"]}

    return evaluate


# ---------------------------------------------------------------------------- evaluation and summary


def _task_records(folder: Path, scorers: dict, teach: Teacher, cfg: StaticDistillConfig) -> list[dict]:
    """Per --eval-tasks task: the static model's dev record, scored on the folder as written (its loader, tokenizer
    and normalisation, as ``compress eval --embedding`` reads it), and its retention of the teacher's primary metric."""
    if not scorers:
        return []
    model, tokenizer, spec = load_model(folder, head="base"), load_tokenizer(folder), read_spec(folder)
    records = []
    for task, ds, teacher_score in scorers.values():
        metrics, details = embedding_scorer(tokenizer, task, ds, spec, batch_size=64)(model)
        records.append(embedding_record(task, "dev", len(ds), metrics, details, spec, data=cfg.data_dir or "the Hugging Face hub"))
        primary = embedding_primary_metric(task)
        teacher_value = teacher_embedding_score(teach, task, primary, teacher_score)
        records.append({
            "kind": "retention", "task": task.name, "metric": primary, "embedding": True, "student": metrics[primary],
            "teacher": teacher_value, "ratio": metrics[primary] / teacher_value if teacher_value else None, "when": utc_now(),
        })
    return records


def summarize_static(out: Path, cfg: StaticDistillConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress distill-static`` prints: the table's shape, the held-out loss before/after, eval tasks, retention."""
    record = read_compression(out)
    built, refinement = record.get("static") or {}, record.get("refinement") or {}
    lines = [f"static model: {built.get('vocabulary')} tokens x {built.get('dimension')} "
             f"(teacher width {built.get('teacher_width')}; PCA {built.get('pca_dims') or 'none'}; "
             f"SIF {built.get('sif_coefficient') or 'none'})"]
    results = read_metrics(out)
    evals = [r for r in results if r.get("kind") == EMBEDDING_EVAL]
    if evals:
        lines.append(format_table(evals))
    before, after = refinement.get("before") or {}, refinement.get("after") or {}
    for term in cfg.losses:
        key = f"heldout_{term}"
        if key in before and key in after:
            lines.append(f"held-out {term}: {before[key]:.4f} before refinement -> {after[key]:.4f} "
                         f"(best, step {refinement.get('best_step')})")
    if refinement and not refinement.get("kept"):
        lines.append("no epoch beat the unrefined table on the held-out sentences: the unrefined table was kept")
    for r in results:
        if r.get("kind") == "retention" and r.get("ratio") is not None:
            lines.append(f"retention: {r['student']:.2f} / {r['teacher']:.2f} = {100 * r['ratio']:.1f}% of the teacher's "
                         f"{r['task']} {r['metric']}")
    return "\n".join(lines), []
