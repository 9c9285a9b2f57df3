"""Structured pruning that physically removes attention heads, whole layers and FFN neurons.

``prune(model_dir, out, cfg)``: score units with ``compress.core.model.importance`` (hooks only),
choose what to remove, cut the weights with ``compress.core.model.structure`` (Q/K/V rows and
output-projection columns for a head; FFN rows/columns; whole layers), optionally
recover accuracy by fine-tuning or by distilling from the unpruned model, and write a
model directory whose ``compression.json`` records the kept heads per layer, FFN widths
and kept layers. The pruned model is smaller and faster, not merely masked, and it
reloads through the artifact loader (and, when its FFN widths are uniform, through
stock ``from_pretrained``).

``prune_embedding(model_dir, out, cfg)`` does the same for a sentence-embedding model,
which has no task loss: units are scored by how far removing them moves the sentence
embeddings of unlabelled text, the check is the cosine to the unpruned embeddings (and
any pair task's embedding score), recovery is embedding distillation, and the output is
a sentence-transformers folder. Both run one plan (:class:`PrunePlan`, :func:`run_plan`).
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from compress.core.model import structure as st
from compress.core.formats.artifacts import require_torch_weights, save_model_dir
from compress.core.formats.folder import open_folder
from compress.core.formats.records import compression_record, read_metrics, utc_now
from compress.core.preflight import check_output
from compress.core.data.features import check_max_length, collate, train_features
from compress.core.data.sources import read_task_data
from compress.core.errors import CompressError
from compress.core.model.graph_pruning import prune_ffn_neurons
from compress.core.model.importance import (
    LossFn,
    ffn_importance_magnitude,
    ffn_importance_taylor,
    head_importance_entropy,
    head_importance_gradient,
    head_importance_magnitude,
    heads_to_remove,
    layer_importance_gradient,
    masked_heads,
    model_loss,
)
from compress.core.registry import Registry
from compress.core.data.resolve import resolve_task, task_fields
from compress.core.formats.runtime import load_folder_for_task, load_folder_model, load_model, load_model_for_task
from compress.core.formats.sentence import SentenceSpec, finish, pooled, pooled_embeddings, read_spec, staged_sentence_files, tokenize
from compress.core.model.structure import config_sizes, heads_per_layer
from compress.core.data.tasks import get_task
from compress.distill.task import DistillConfig, check_teacher_fit, dev_labels, distill
from compress.distill.embedding import distill_embedding, embedding_scorers, embedding_sentences
from compress.eval.embeddings import embedding_record
from compress.eval.embeddings import primary_metric as embedding_primary_metric
from compress.eval.evaluate import dev_evaluator, split_records, test_records
from compress.teacher.finetune import FinetuneConfig, finetune
from compress.teacher.presets import open_model, resolve_model
from compress.prune_config import EmbeddingPruneConfig, PruneConfig, PrunePlan


log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- choosing heads



def head_count(total: int, spec: float) -> int:
    """Heads to remove from a fraction (0.5) or a count (48)."""
    return int(spec) if spec >= 1 else int(round(total * spec))


def layers_to_keep(spec: str, n_layers: int, importance: Sequence[float] | None = None) -> list[int]:
    """Layer ids to keep for a --remove-layers strategy (Sajjad et al., "Poor Man's BERT", 2020)."""
    spec = spec.strip().lower()
    name, _, arg = spec.partition(":")
    if name in ("top", "bottom", "importance"):
        try:
            k = int(arg)
        except ValueError:
            raise CompressError(f"--remove-layers {spec!r}: write {name}:N with N the number of layers to drop") from None
        if not 0 < k < n_layers:
            raise CompressError(f"--remove-layers {spec!r}: can drop 1 to {n_layers - 1} of {n_layers} layers")
        if name == "top":
            return list(range(n_layers - k))
        if name == "bottom":
            return list(range(k, n_layers))
        order = sorted(range(n_layers), key=lambda i: importance[i])
        return sorted(set(range(n_layers)) - set(order[:k]))
    if name in ("alternate", "odd", "even"):
        drop = set(range(1, n_layers, 2)) if name in ("alternate", "odd") else set(range(0, n_layers, 2))
        return [i for i in range(n_layers) if i not in drop]
    try:
        drop = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise CompressError(f"--remove-layers {spec!r}: use top:N, bottom:N, alternate, importance:N or ids like 1,3,5") from None
    if not drop or drop[-1] >= n_layers or drop[0] < 0:
        raise CompressError(f"--remove-layers {spec!r}: layer ids must be in 0..{n_layers - 1}")
    keep = [i for i in range(n_layers) if i not in drop]
    if not keep:
        raise CompressError("--remove-layers would drop every layer; keep at least one")
    return keep


def ffn_to_keep(scores: Sequence[Sequence[float]], fraction: float, scope: str) -> list[list[int]]:
    """Neuron ids to keep per layer: the same number per layer (uniform) or by global rank."""
    if scope == "uniform":
        keep = []
        width = min(len(s) for s in scores)
        k = max(1, int(round(width * (1 - fraction))))  # at least 1: _check_ffn_amount refused fewer up front
        for s in scores:
            order = sorted(range(len(s)), key=lambda i: -float(s[i]))
            keep.append(sorted(order[:k]))
        return keep
    total = sum(len(s) for s in scores)
    n_remove = int(round(total * fraction))
    order = sorted((float(s[i]), l, i) for l, s in enumerate(scores) for i in range(len(s)))
    removed: list[set[int]] = [set() for _ in scores]
    for _, l, i in order:
        if n_remove == 0:
            break
        if len(scores[l]) - len(removed[l]) > 1:  # at least one neuron per layer
            removed[l].add(i)
            n_remove -= 1
    return [sorted(set(range(len(s))) - removed[l]) for l, s in enumerate(scores)]


# ---------------------------------------------------------------------------- scoring


@dataclass
class PruneContext:
    """What the pruning steps share: the scoring batches and loss, the check, the recovery and a log of each step."""

    cfg: PrunePlan
    batches: list[dict]
    loss_fn: LossFn  # (model, batch) -> scalar whose gate gradients score the units
    evaluate: Callable[[Any], dict[str, float]]  # model -> the check's metrics
    primary: str  # the metric of ``evaluate`` that --until watches and the summary reports
    recover: Callable[[Any], Any] | None  # pruned model -> recovered model (None: no recovery)
    rng: random.Random
    log: list[dict] = field(default_factory=list)


HEAD_CRITERIA: Registry[Callable[[Any, PruneContext], list[torch.Tensor]]] = Registry("head criterion")


@HEAD_CRITERIA.register("gradient")
def _gradient(model, ctx: PruneContext):
    return head_importance_gradient(model, ctx.batches, loss_fn=ctx.loss_fn, normalize=ctx.cfg.normalize)


@HEAD_CRITERIA.register("magnitude")
def _magnitude(model, ctx: PruneContext):
    return head_importance_magnitude(model)


@HEAD_CRITERIA.register("entropy")
def _entropy(model, ctx: PruneContext):
    return head_importance_entropy(model, ctx.batches)


@HEAD_CRITERIA.register("random")
def _random(model, ctx: PruneContext):
    return [torch.tensor([ctx.rng.random() for _ in range(n)]) for n in heads_per_layer(model)]


def embedding_sensitivity_loss(spec: SentenceSpec, seed: int = 0) -> LossFn:
    """A loss whose gate gradients measure how far removing a unit moves the sentence embeddings.

    For a gate g on a unit, with e_b the final embedding of sentence b (normalised when
    the folder normalises) and r_b a fresh standard-normal vector per sentence, the loss
    sum_b r_b . e_b has dL/dg = sum_b r_b . (de_b/dg), whose square has expectation
    sum_b ||de_b/dg||^2: the squared first-order change of the embeddings when the unit
    goes. (A distance to the unpruned embeddings would have a zero gradient at g = 1.)
    The projections come from a seeded generator, so scores repeat run to run.
    """
    generator = torch.Generator().manual_seed(seed)

    def loss_fn(model, batch: dict) -> torch.Tensor:
        embeddings = finish(pooled_embeddings(model, batch, spec.pooling), spec)  # (batch, d)
        r = torch.randn(embeddings.shape, generator=generator).to(embeddings.device, embeddings.dtype)
        return (embeddings * r).sum()

    return loss_fn


# ---------------------------------------------------------------------------- the steps


def run_plan(model, ctx: PruneContext) -> None:
    """Drop layers, remove heads (a count, or Michel's --until), remove FFN neurons: in that order, in place."""
    if ctx.cfg.remove_layers:
        _prune_layers(model, ctx)
    if ctx.cfg.remove_heads is not None:
        _prune_heads(model, ctx)
    elif ctx.cfg.until is not None:
        _prune_heads_until(model, ctx, ctx.log[0]["dev"][ctx.primary])
    if ctx.cfg.remove_ffn is not None:
        _prune_ffn(model, ctx)


def _check_plan(model, cfg: PrunePlan) -> None:
    """Refuse removing every head or layer up front (the steps check again as they go)."""
    n_layers = len(st.encoder_layers(model))
    if cfg.remove_layers and "importance" not in cfg.remove_layers:
        n_layers = len(layers_to_keep(cfg.remove_layers, n_layers))
    elif cfg.remove_layers:
        layers_to_keep(cfg.remove_layers, n_layers, [0.0] * n_layers)  # validates the count
    if cfg.remove_heads is not None:
        heads = sum(st.heads_per_layer(model)) * n_layers // len(st.encoder_layers(model))
        target = head_count(heads, cfg.remove_heads)
        if target > heads - n_layers:
            raise CompressError(
                f"--remove-heads {cfg.remove_heads:g} would remove {target} of {heads} heads, but every one of the {n_layers} "
                f"layers keeps at least one; remove at most {heads - n_layers} or drop layers with --remove-layers"
            )
    if cfg.remove_ffn is not None:
        _check_ffn_amount(st.ffn_widths(model), cfg.remove_ffn, cfg.ffn_scope)


def _check_ffn_amount(widths: list[int], fraction: float, scope: str) -> None:
    """Refuse a --remove-ffn fraction that rounds to every neuron of a layer (uniform) or of all but one per layer (global)."""
    if scope == "uniform":
        width = min(widths)
        if round(width * (1 - fraction)) < 1:
            raise CompressError(f"--remove-ffn {fraction:g} would remove all {width} FFN neurons of a layer; every layer "
                                f"keeps at least one, so the fraction must be at most {(width - 1) / width:.4g}")
        return
    total, n_layers = sum(widths), len(widths)
    if round(total * fraction) > total - n_layers:
        raise CompressError(f"--remove-ffn {fraction:g} would remove {round(total * fraction)} of {total} FFN neurons, "
                            f"but each of the {n_layers} layers keeps at least one; the fraction must be at most "
                            f"{(total - n_layers) / total:.4g}")


def _method(cfg: PrunePlan, recovery: str) -> str:
    parts = []
    if cfg.remove_layers:
        parts.append(f"layers:{cfg.remove_layers}")
    if cfg.remove_heads is not None or cfg.until is not None:
        parts.append(f"heads:{cfg.head_criterion}")
    if cfg.remove_ffn is not None:
        parts.append(f"ffn:{cfg.ffn_criterion}")
    if recovery != "none":
        parts.append(f"recovery:{recovery}")
    return "+".join(parts)


def _prune_layers(model, ctx: PruneContext) -> None:
    n = len(st.encoder_layers(model))
    importance = layer_importance_gradient(model, ctx.batches, loss_fn=ctx.loss_fn).tolist() if "importance" in ctx.cfg.remove_layers else None
    keep = layers_to_keep(ctx.cfg.remove_layers, n, importance)
    st.drop_layers(model, keep)
    ctx.log.append({"step": "layers", "kept": keep, "importance": importance, "dev": ctx.evaluate(model)})


def _prune_heads(model, ctx: PruneContext) -> None:
    total = sum(st.heads_per_layer(model))
    target = head_count(total, ctx.cfg.remove_heads)
    if target >= total:
        raise CompressError(f"--remove-heads {ctx.cfg.remove_heads} would remove all {total} heads; keep at least one per layer")
    how = "a count" if ctx.cfg.remove_heads >= 1 else f"a fraction of {total}"
    log.info("--remove-heads %g read as %s: removing %d of %d heads", ctx.cfg.remove_heads, how, target, total)
    done = 0
    for it in range(ctx.cfg.iterations):
        # equal steps; the last one takes the remainder
        step_count = round(target * (it + 1) / ctx.cfg.iterations) - done
        scores = HEAD_CRITERIA.get(ctx.cfg.head_criterion)(model, ctx)
        plan = heads_to_remove([s.tolist() for s in scores], step_count, ctx.cfg.head_scope)
        st.prune_heads(model, plan)
        done += step_count
        entry = {"step": f"heads {it + 1}/{ctx.cfg.iterations}", "removed": {str(k): v for k, v in plan.items()},
                 "heads": st.heads_per_layer(model), "scores": [s.tolist() for s in scores]}
        if ctx.cfg.iterations > 1 and ctx.recover is not None and it < ctx.cfg.iterations - 1:
            model.load_state_dict(ctx.recover(model).state_dict())
        entry["dev"] = ctx.evaluate(model)
        ctx.log.append(entry)


def _prune_heads_until(model, ctx: PruneContext, start: float) -> None:
    """Michel et al.'s procedure: mask the least important heads step by step while the dev
    metric stays above ``until`` x the start, then remove the last acceptable set for real."""
    sizes = st.heads_per_layer(model)
    total = sum(sizes)
    scores = [s.tolist() for s in HEAD_CRITERIA.get(ctx.cfg.head_criterion)(model, ctx)]
    floor = ctx.cfg.until * start
    accepted: dict[int, list[int]] = {}
    curve = []
    k = 0
    while True:
        k += max(1, int(round(ctx.cfg.until_step * total)))
        if k > total - len(sizes):
            break
        plan = heads_to_remove(scores, k, ctx.cfg.head_scope)
        keep = [[h not in plan.get(l, []) for h in range(n)] for l, n in enumerate(sizes)]
        with masked_heads(model, keep):
            metric = ctx.evaluate(model)[ctx.primary]
        curve.append({"removed": k, "fraction": k / total, "metric": metric})
        if metric < floor:
            break
        accepted = plan
    st.prune_heads(model, accepted)
    ctx.log.append({"step": "heads (until)", "floor": floor, "curve": curve,
                    "removed": {str(l): h for l, h in accepted.items()}, "heads": st.heads_per_layer(model)})


def _prune_ffn(model, ctx: PruneContext) -> None:
    if ctx.cfg.ffn_criterion == "taylor":
        scores = ffn_importance_taylor(model, ctx.batches, loss_fn=ctx.loss_fn)
    else:
        scores = ffn_importance_magnitude(model)
    keep = ffn_to_keep([s.tolist() for s in scores], ctx.cfg.remove_ffn, ctx.cfg.ffn_scope)
    prune_ffn_neurons(model, keep)  # torch-pruning's dependency graph finds the coupled weights
    ctx.log.append({"step": "ffn", "widths": st.ffn_widths(model), "dev": ctx.evaluate(model)})


def _prune_and_recover(model, ctx: PruneContext, recovery: str) -> tuple[Any, dict, dict | None, dict]:
    """Run the plan and the recovery, logging each; returns (model, after pruning, after recovery or None, summary)."""
    before = ctx.log[0]
    run_plan(model, ctx)
    after_prune = ctx.evaluate(model)
    ctx.log.append({"step": "pruned", "params": st.count_parameters(model), "dev": after_prune})
    recovered = None
    if ctx.recover is not None:
        model = ctx.recover(model)
        recovered = ctx.evaluate(model)
        ctx.log.append({"step": f"recovered ({recovery})", "params": st.count_parameters(model), "dev": recovered})
    summary = {
        "kind": "prune", "metric": ctx.primary, "before": before["dev"].get(ctx.primary),
        "after_prune": after_prune.get(ctx.primary), "after_recovery": recovered.get(ctx.primary) if recovered else None,
        "params_before": before["params"], "params_after": st.count_parameters(model), "steps": ctx.log, "when": utc_now(),
    }
    return model, after_prune, recovered, summary


def _batches(features, tokenizer, task=None, batch_size: int = 16) -> list[dict]:
    pad = collate(tokenizer, task)
    rows = [features[i] for i in range(len(features))]
    return [pad(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]


def _saved_copy(model, tokenizer, directory: Path, files: dict[str, Path] | None = None) -> Path:
    """The model as an intermediate model directory (the input of a recovery stage)."""
    return save_model_dir(model, directory, tokenizer=tokenizer, files=files,
                          record=compression_record(stage="prune", method="intermediate"))


# ---------------------------------------------------------------------------- a task model


def prune(model_dir: str | Path, out: str | Path, cfg: PruneConfig, *, overwrite: bool = False) -> Path:
    """Prune ``model_dir`` as ``cfg`` says, optionally recover, and write the result to ``out``.

    Units are scored with the task's loss on ``importance_examples`` training examples;
    the check is the task's dev metric.
    """
    out = Path(out)
    check_output(out, overwrite, inputs=(model_dir, cfg))
    folder = open_folder(model_dir).check_torch("pruning")
    model_dir = folder.path
    task = resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file, model=folder)
    if cfg.recovery_teacher:  # a missing teacher fails before any scoring, not after
        cfg = replace(cfg, recovery_teacher=str(require_torch_weights(resolve_model(cfg.recovery_teacher), "--recovery-teacher")))
    # Every split is read and checked before the tokenizer and the weights are loaded: a data error costs no model.
    splits = read_task_data(task, replace(cfg.data, max_train_examples=cfg.importance_examples), seed=cfg.train.seed)
    dev, test = splits.dev, splits.test
    tokenizer = folder.tokenizer
    model = load_folder_for_task(folder, task)
    _check_plan(model, cfg)  # impossible requests fail before any unit is scored
    max_length = cfg.data.resolved_max_length(task, config_sizes(model.config).max_positions)
    features = train_features(splits.train, task, tokenizer, max_length, doc_stride=cfg.data.doc_stride)
    evaluate = dev_evaluator(task, tokenizer, dev, max_length, batch_size=cfg.data.eval_batch_size, doc_stride=cfg.data.doc_stride)

    def recover(pruned):
        return _recover_task(pruned, model_dir, tokenizer, task, cfg)

    ctx = PruneContext(cfg, _batches(features, tokenizer, task), model_loss, evaluate, task.primary_metric,
                       recover if cfg.recovery != "none" else None, random.Random(cfg.train.seed))
    before = {"params": st.count_parameters(model), "structure": st.describe(model), "dev": evaluate(model)}
    # Said before any pruning: scores and cuts of a model that is not fine-tuned for the task mean nothing.
    fit = check_teacher_fit(folder, task, before["dev"], dev_labels(dev), role="the model to prune", advice=(
        f"Its importance scores and the dev metric that checks each cut mean nothing; prune a model fine-tuned on "
        f"{task.display} (compress teacher finetune)."))
    ctx.log.append({"step": "start", "params": before["params"], "dev": before["dev"]})
    model, after_prune, recovered, summary = _prune_and_recover(model, ctx, cfg.recovery)
    summary.update(task=task.name, teacher_at_chance=fit["at_chance"], teacher_warning=fit["warning"])
    record = compression_record(
        stage="prune", method=_method(cfg, cfg.recovery), config=cfg, parent=folder, seed=cfg.train.seed,
        extra={**task_fields(task), "before": before, "summary": {k: v for k, v in summary.items() if k != "steps"},
               "teacher_check": fit, "teacher_at_chance": fit["at_chance"]},
    )
    records = split_records(task, dev, recovered or after_prune, data=cfg.data.describe("dev"), max_length=max_length,
                            batch_size=cfg.data.eval_batch_size)
    records += test_records(model, tokenizer, task, test, cfg.data, max_length)
    return save_model_dir(model, out, tokenizer=tokenizer, record=record, overwrite=overwrite, metrics=[*records, summary])


def summarize(out: Path, cfg: PrunePlan, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress prune`` (and ``prune-embedding``) prints: parameters and the check before, after pruning and after recovery."""
    summary = next(r for r in read_metrics(out) if r.get("kind") == "prune")
    rows = [("", "params", summary["metric"])]
    rows.append(("before", f"{summary['params_before'] / 1e6:.2f}M", f"{summary['before']:.2f}"))
    rows.append(("pruned", f"{summary['params_after'] / 1e6:.2f}M", f"{summary['after_prune']:.2f}"))
    if summary.get("after_recovery") is not None:
        rows.append(("recovered", f"{summary['params_after'] / 1e6:.2f}M", f"{summary['after_recovery']:.2f}"))
    width = max(10, len(summary["metric"]))
    table = "\n".join(f"{r[0]:<10} {r[1]:>10} {r[2]:>{width}}" for r in rows)
    if not summary.get("teacher_warning"):
        return table, []
    what = "AT CHANCE" if summary.get("teacher_at_chance") else "NOT FINE-TUNED FOR THE TASK"
    return f"{table}\nTHE MODEL BEFORE PRUNING WAS {what}: these numbers mean nothing", [f"warning: {summary['teacher_warning']}"]


def _recover_task(model, model_dir: Path, tokenizer, task, cfg: PruneConfig):
    """Fine-tune the pruned model, or distil it from the unpruned one (or ``recovery_teacher``), through those stages."""
    scratch = Path(tempfile.mkdtemp(prefix="compress-prune-"))
    try:
        pruned = _saved_copy(model, tokenizer, scratch / "pruned")
        data = replace(cfg.data, test_file=None)  # the pruned model is scored on the test file once, at the end
        if cfg.recovery == "finetune":
            out = finetune(pruned, scratch / "recovered", FinetuneConfig(data=data, train=cfg.train), task=task)
        else:
            dcfg = DistillConfig(init=str(pruned), losses=("kd", "hard"), data=data, train=cfg.train)
            out = distill(cfg.recovery_teacher or model_dir, scratch / "recovered", dcfg, task=task)
        return load_model_for_task(out, task)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------------------- a sentence-embedding model


CHECK = "cosine"  # the check without eval tasks: mean cosine (x100) to the unpruned model's embeddings of held-out sentences


def prune_embedding(model_dir: str | Path, out: str | Path, cfg: EmbeddingPruneConfig, *, overwrite: bool = False) -> Path:
    """Prune a sentence-embedding model (a sentence-transformers folder, or any encoder: mean pooling).

    Units are scored by how far their removal moves the sentence embeddings
    (:func:`embedding_sensitivity_loss`) on ``importance_sentences`` unlabelled sentences;
    the check is the mean cosine between the pruned and the unpruned model's embeddings
    of held-out sentences, plus each ``eval_tasks`` score (the first one is the primary
    metric). Recovery distils the unpruned model's embeddings back into the pruned one.
    The output is a sentence-transformers folder with the input's pooling, normalisation
    and ``max_seq_length``.
    """
    out = Path(out)
    check_output(out, overwrite, inputs=(model_dir, cfg))
    folder = open_model(model_dir).check_torch("pruning")
    model_dir = folder.path
    spec = read_spec(model_dir)
    tokenizer = folder.tokenizer
    model = load_folder_model(folder, head="base", attn_implementation="eager" if cfg.head_criterion == "entropy" else None)
    _check_plan(model, cfg)
    check_max_length(cfg.max_length, config_sizes(model.config).max_positions)
    sentence_cfg = cfg.distill_config(init=str(model_dir))  # the sentence sources and eval tasks, as distillation reads them
    sentences, sources = embedding_sentences(sentence_cfg)
    n_held = min(cfg.heldout_sentences, len(sentences) // 10)  # the same held-out sentences as the recovery's
    held, scoring = sentences[:n_held], sentences[n_held : n_held + cfg.importance_sentences]
    batches = [tokenize(tokenizer, scoring[i : i + 16], spec, cfg.max_length) for i in range(0, len(scoring), 16)]
    scorers = embedding_scorers(sentence_cfg, tokenizer, spec)
    reference = finish(pooled(model, tokenizer, held, spec, max_length=cfg.max_length), spec) if held else None

    def evaluate(candidate) -> dict[str, float]:
        result = {}
        if reference is not None:
            mine = finish(pooled(candidate, tokenizer, held, spec, max_length=cfg.max_length), spec)
            result[CHECK] = 100 * float(torch.nn.functional.cosine_similarity(mine, reference, dim=-1).mean())
        for name, (_, _, score) in scorers.items():
            result.update({f"{name}/{k}": v for k, v in score(candidate)[0].items()})
        return result

    def recover(pruned):
        return _recover_embedding(pruned, model_dir, tokenizer, spec, cfg)

    primary = f"{cfg.eval_tasks[0]}/{embedding_primary_metric(get_task(cfg.eval_tasks[0]))}" if cfg.eval_tasks else CHECK
    if primary == CHECK and reference is None:
        raise CompressError(f"{len(sentences)} sentences leave none to check the pruned model on; add text or pass --eval-tasks")
    ctx = PruneContext(cfg, batches, embedding_sensitivity_loss(spec, cfg.train.seed), evaluate, primary,
                       recover if cfg.recovery != "none" else None, random.Random(cfg.train.seed))
    before = {"params": st.count_parameters(model), "structure": st.describe(model), "dev": evaluate(model)}
    ctx.log.append({"step": "start", "params": before["params"], "dev": before["dev"]})
    model, _, _, summary = _prune_and_recover(model, ctx, cfg.recovery)
    summary.update(embedding=True, sentences={"sources": sources, "heldout": n_held, "scoring": len(scoring)})
    record = compression_record(
        stage="prune-embedding", method=_method(cfg, cfg.recovery), config=cfg, parent=folder, seed=cfg.train.seed,
        extra={"before": before, "summary": {k: v for k, v in summary.items() if k != "steps"},
               "sentence": {"pooling": spec.pooling, "normalize": spec.normalize, "max_seq_length": spec.max_seq_length}},
    )
    records = [embedding_record(task, "dev", len(ds), *score(model), spec, data=cfg.data_dir or "the Hugging Face hub")
               for task, ds, score in scorers.values()]
    stage, files = staged_sentence_files(spec, config_sizes(model.config).hidden)
    with stage:
        return save_model_dir(model, out, tokenizer=tokenizer, record=record, overwrite=overwrite,
                              metrics=[*records, summary], files=files)


def _recover_embedding(model, model_dir: Path, tokenizer, spec: SentenceSpec, cfg: EmbeddingPruneConfig):
    """Distil the unpruned model's sentence embeddings into the pruned one (``distill-embedding --init``)."""
    scratch = Path(tempfile.mkdtemp(prefix="compress-prune-"))
    try:
        stage, files = staged_sentence_files(spec, config_sizes(model.config).hidden)
        with stage:
            pruned = _saved_copy(model, tokenizer, scratch / "pruned", files)
        out = distill_embedding(model_dir, scratch / "recovered", cfg.distill_config(str(pruned)))
        return load_model(out, head="base")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
