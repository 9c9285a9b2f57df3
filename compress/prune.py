"""Structured pruning that physically removes attention heads, whole layers and FFN neurons.

``prune(model_dir, out, cfg)``: score units with ``compress.core.importance`` (hooks only),
choose what to remove, cut the weights with ``compress.core.structure`` (Q/K/V rows and
output-projection columns for a head; FFN rows/columns; whole layers), optionally
recover accuracy by fine-tuning or by distilling from the unpruned model, and write a
model directory whose ``compression.json`` records the kept heads per layer, FFN widths
and kept layers. The pruned model is smaller and faster, not merely masked, and it
reloads through the artifact loader (and, when its FFN widths are uniform, through
stock ``from_pretrained``).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Sequence

import torch

from compress.core import structure as st
from compress.core.artifacts import (
    check_output,
    compression_record,
    load_tokenizer,
    read_metrics,
    require_torch_weights,
    save_model_dir,
    utc_now,
)
from compress.core.config import option
from compress.core.data import TaskData, collate, load_task_data
from compress.core.errors import CompressError
from compress.core.graph_pruning import prune_ffn_neurons
from compress.core.importance import (
    ffn_importance_magnitude,
    ffn_importance_taylor,
    head_importance_entropy,
    head_importance_gradient,
    head_importance_magnitude,
    heads_to_remove,
    layer_importance_gradient,
    masked_heads,
)
from compress.core.registry import Registry
from compress.core.runtime import load_model_for_task
from compress.core.structure import heads_per_layer
from compress.core.tasks import get_task
from compress.core.train import TrainConfig
from compress.distill import DistillConfig, distill
from compress.eval.evaluate import dev_evaluator, split_records
from compress.teacher.finetune import FinetuneConfig, finetune


def _recovery_defaults() -> TrainConfig:
    return TrainConfig(epochs=1, lr=2e-5, batch_size=32, warmup_ratio=0.1)


@dataclass(frozen=True)
class PruneConfig:
    task: str = option("", "task the model is fine-tuned on (scores use its loss, checks use its dev metric)")
    heads: float | None = option(None, "heads to remove: a fraction (0.5) or a count (48)")
    head_scope: Literal["global", "layer"] = option("global", "rank heads across all layers, or the same share in each layer")
    head_criterion: Literal["gradient", "magnitude", "entropy", "random"] = option("gradient", "head importance: Michel's gate gradient, weight magnitude, attention entropy, random")
    normalize: bool = option(True, "normalise gradient importance per layer (Michel et al.)")
    iterations: int = option(1, "prune the heads in this many equal steps, re-scoring (and recovering, if set) in between")
    until: float | None = option(None, "instead of --heads: mask heads 10% at a time while the dev metric stays above this fraction of the start (e.g. 0.99)")
    until_step: float = option(0.1, "with --until: fraction of the original heads masked per step")
    layers: str | None = option(None, "layers to drop: top:N, bottom:N, alternate, importance:N, or 0-based ids 1,3,5")
    ffn: float | None = option(None, "fraction of FFN neurons to remove")
    ffn_criterion: Literal["taylor", "magnitude"] = option("taylor", "FFN neuron importance: activation x gradient, or weight magnitude")
    ffn_scope: Literal["uniform", "global"] = option("uniform", "uniform: the same width in every layer (loads with stock from_pretrained); global: rank all neurons")
    recovery: Literal["none", "finetune", "distill"] = option("none", "after pruning: fine-tune on the task, or distil from the unpruned model")
    importance_examples: int = option(512, "training examples used to score units")
    data: TaskData = field(default_factory=TaskData)
    train: TrainConfig = field(default_factory=_recovery_defaults)

    def validate(self) -> None:
        if not self.task:
            raise CompressError("no task given; pass --task, e.g. --task sst2")
        get_task(self.task)
        if self.heads is None and self.until is None and self.layers is None and self.ffn is None:
            raise CompressError("nothing to prune; pass --heads, --until, --layers and/or --ffn")
        if self.heads is not None and self.until is not None:
            raise CompressError("pass either --heads or --until, not both")
        if self.heads is not None and (self.heads <= 0 or (self.heads >= 1 and self.heads != int(self.heads))):
            raise CompressError(f"--heads must be a fraction in (0, 1) or a whole number of heads, got {self.heads}")
        if self.ffn is not None and not 0 < self.ffn < 1:
            raise CompressError(f"--ffn must be a fraction in (0, 1), got {self.ffn}")
        if self.until is not None and not 0 < self.until <= 1:
            raise CompressError(f"--until must be a fraction of the starting metric in (0, 1], got {self.until}")
        if self.iterations < 1:
            raise CompressError(f"--iterations must be at least 1, got {self.iterations}")
        if not 0 < self.until_step < 1:
            raise CompressError(f"--until-step must be in (0, 1), got {self.until_step}")


# ---------------------------------------------------------------------------- choosing heads



def head_count(total: int, spec: float) -> int:
    """Heads to remove from a fraction (0.5) or a count (48)."""
    return int(spec) if spec >= 1 else int(round(total * spec))


def layers_to_keep(spec: str, n_layers: int, importance: Sequence[float] | None = None) -> list[int]:
    """Layer ids to keep for a --layers strategy (Sajjad et al., "Poor Man's BERT", 2020)."""
    spec = spec.strip().lower()
    name, _, arg = spec.partition(":")
    if name in ("top", "bottom", "importance"):
        try:
            k = int(arg)
        except ValueError:
            raise CompressError(f"--layers {spec!r}: write {name}:N with N the number of layers to drop") from None
        if not 0 < k < n_layers:
            raise CompressError(f"--layers {spec!r}: can drop 1 to {n_layers - 1} of {n_layers} layers")
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
        raise CompressError(f"--layers {spec!r}: use top:N, bottom:N, alternate, importance:N or ids like 1,3,5") from None
    if not drop or drop[-1] >= n_layers or drop[0] < 0:
        raise CompressError(f"--layers {spec!r}: layer ids must be in 0..{n_layers - 1}")
    keep = [i for i in range(n_layers) if i not in drop]
    if not keep:
        raise CompressError("--layers would drop every layer; keep at least one")
    return keep


def ffn_to_keep(scores: Sequence[Sequence[float]], fraction: float, scope: str) -> list[list[int]]:
    """Neuron ids to keep per layer: the same number per layer (uniform) or by global rank."""
    if scope == "uniform":
        keep = []
        width = min(len(s) for s in scores)
        k = max(1, int(round(width * (1 - fraction))))
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


HEAD_CRITERIA: Registry = Registry("head criterion")


@HEAD_CRITERIA.register("gradient")
def _gradient(model, batches, cfg, rng):
    return head_importance_gradient(model, batches, normalize=cfg.normalize)


@HEAD_CRITERIA.register("magnitude")
def _magnitude(model, batches, cfg, rng):
    return head_importance_magnitude(model)


@HEAD_CRITERIA.register("entropy")
def _entropy(model, batches, cfg, rng):
    return head_importance_entropy(model, batches)


@HEAD_CRITERIA.register("random")
def _random(model, batches, cfg, rng):
    return [torch.tensor([rng.random() for _ in range(n)]) for n in heads_per_layer(model)]


# ---------------------------------------------------------------------------- entry point


@dataclass
class PruneContext:
    """What the pruning steps share: the data, the evaluator and a record of each step."""

    task: Any
    tokenizer: Any
    batches: list[dict]
    evaluate: Any
    cfg: PruneConfig
    rng: random.Random
    log: list[dict] = field(default_factory=list)


def prune(model_dir: str | Path, out: str | Path, cfg: PruneConfig, *, overwrite: bool = False) -> Path:
    """Prune ``model_dir`` as ``cfg`` says, optionally recover, and write the result to ``out``."""
    task = get_task(cfg.task)
    out = Path(out)
    check_output(out, overwrite)
    model_dir = require_torch_weights(model_dir, "pruning")
    tokenizer = load_tokenizer(model_dir)
    model = load_model_for_task(model_dir, task)
    _check_plan(model, cfg)  # impossible requests fail before any data is read
    max_length = cfg.data.resolved_max_length(task, model.config.max_position_embeddings)
    features, dev, _ = load_task_data(task, tokenizer, replace(cfg.data, max_train_examples=cfg.importance_examples),
                                      max_length, seed=cfg.train.seed)
    evaluate = dev_evaluator(task, tokenizer, dev, max_length, batch_size=cfg.data.eval_batch_size, doc_stride=cfg.data.doc_stride)
    ctx = PruneContext(task, tokenizer, _batches(features, tokenizer), evaluate, cfg, random.Random(cfg.train.seed))

    before = {"params": st.count_parameters(model), "structure": st.describe(model), "dev": evaluate(model)}
    ctx.log.append({"step": "start", "params": before["params"], "dev": before["dev"]})
    if cfg.layers:
        _prune_layers(model, ctx)
    if cfg.heads is not None:
        _prune_heads(model, ctx, model_dir)
    elif cfg.until is not None:
        _prune_heads_until(model, ctx, before["dev"][task.primary_metric])
    if cfg.ffn is not None:
        _prune_ffn(model, ctx)
    after_prune = evaluate(model)
    ctx.log.append({"step": "pruned", "params": st.count_parameters(model), "dev": after_prune})
    recovered = None
    if cfg.recovery != "none":
        model = _recover(model, model_dir, ctx, cfg.recovery)
        recovered = evaluate(model)
        ctx.log.append({"step": f"recovered ({cfg.recovery})", "params": st.count_parameters(model), "dev": recovered})

    final = recovered or after_prune
    primary = task.primary_metric
    summary = {
        "kind": "prune", "task": task.name, "metric": primary, "before": before["dev"].get(primary),
        "after_prune": after_prune.get(primary), "after_recovery": recovered.get(primary) if recovered else None,
        "params_before": before["params"], "params_after": st.count_parameters(model), "steps": ctx.log, "when": utc_now(),
    }
    record = compression_record(
        stage="prune", method=_method(cfg), config=cfg, parent=model_dir, seed=cfg.train.seed,
        extra={"task": task.name, "before": before, "summary": {k: v for k, v in summary.items() if k != "steps"}},
    )
    records = split_records(task, dev, final, data=cfg.data.describe(), max_length=max_length)
    return save_model_dir(model, out, tokenizer=tokenizer, record=record, overwrite=overwrite, metrics=[*records, summary])


def summarize(out: Path, cfg: PruneConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress prune`` prints: parameters and dev metric before, after pruning and after recovery."""
    summary = next(r for r in read_metrics(out) if r.get("kind") == "prune")
    rows = [("", "params", summary["metric"])]
    rows.append(("before", f"{summary['params_before'] / 1e6:.2f}M", f"{summary['before']:.2f}"))
    rows.append(("pruned", f"{summary['params_after'] / 1e6:.2f}M", f"{summary['after_prune']:.2f}"))
    if summary.get("after_recovery") is not None:
        rows.append(("recovered", f"{summary['params_after'] / 1e6:.2f}M", f"{summary['after_recovery']:.2f}"))
    return "\n".join(f"{r[0]:<10} {r[1]:>10} {r[2]:>10}" for r in rows), []


def _check_plan(model, cfg: PruneConfig) -> None:
    """Refuse removing every head or layer up front (the steps check again as they go)."""
    n_layers = len(st.encoder_layers(model))
    if cfg.layers and "importance" not in cfg.layers:
        n_layers = len(layers_to_keep(cfg.layers, n_layers))
    elif cfg.layers:
        layers_to_keep(cfg.layers, n_layers, [0.0] * n_layers)  # validates the count
    if cfg.heads is not None:
        heads = sum(st.heads_per_layer(model)) * n_layers // len(st.encoder_layers(model))
        target = head_count(heads, cfg.heads)
        if target > heads - n_layers:
            raise CompressError(
                f"--heads {cfg.heads:g} would remove {target} of {heads} heads, but every one of the {n_layers} "
                f"layers keeps at least one; remove at most {heads - n_layers} or drop layers with --layers"
            )


def _method(cfg: PruneConfig) -> str:
    parts = []
    if cfg.layers:
        parts.append(f"layers:{cfg.layers}")
    if cfg.heads is not None or cfg.until is not None:
        parts.append(f"heads:{cfg.head_criterion}")
    if cfg.ffn is not None:
        parts.append(f"ffn:{cfg.ffn_criterion}")
    if cfg.recovery != "none":
        parts.append(f"recovery:{cfg.recovery}")
    return "+".join(parts)


def _batches(features, tokenizer, batch_size: int = 16) -> list[dict]:
    pad = collate(tokenizer)
    rows = [features[i] for i in range(len(features))]
    return [pad(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]


def _prune_layers(model, ctx: PruneContext) -> None:
    n = len(st.encoder_layers(model))
    importance = layer_importance_gradient(model, ctx.batches).tolist() if "importance" in ctx.cfg.layers else None
    keep = layers_to_keep(ctx.cfg.layers, n, importance)
    st.drop_layers(model, keep)
    ctx.log.append({"step": "layers", "kept": keep, "importance": importance, "dev": ctx.evaluate(model)})


def _score_heads(model, ctx: PruneContext):
    return HEAD_CRITERIA.get(ctx.cfg.head_criterion)(model, ctx.batches, ctx.cfg, ctx.rng)


def _prune_heads(model, ctx: PruneContext, model_dir: Path) -> None:
    total = sum(st.heads_per_layer(model))
    target = head_count(total, ctx.cfg.heads)
    if target >= total:
        raise CompressError(f"--heads {ctx.cfg.heads} would remove all {total} heads; keep at least one per layer")
    done = 0
    for it in range(ctx.cfg.iterations):
        # equal steps; the last one takes the remainder
        step_count = round(target * (it + 1) / ctx.cfg.iterations) - done
        scores = _score_heads(model, ctx)
        plan = heads_to_remove([s.tolist() for s in scores], step_count, ctx.cfg.head_scope)
        st.prune_heads(model, plan)
        done += step_count
        entry = {"step": f"heads {it + 1}/{ctx.cfg.iterations}", "removed": {str(k): v for k, v in plan.items()},
                 "heads": st.heads_per_layer(model), "scores": [s.tolist() for s in scores]}
        if ctx.cfg.iterations > 1 and ctx.cfg.recovery != "none" and it < ctx.cfg.iterations - 1:
            model_recovered = _recover(model, model_dir, ctx, ctx.cfg.recovery)
            _copy_into(model, model_recovered)
        entry["dev"] = ctx.evaluate(model)
        ctx.log.append(entry)


def _prune_heads_until(model, ctx: PruneContext, start: float) -> None:
    """Michel et al.'s procedure: mask the least important heads step by step while the dev
    metric stays above ``until`` x the start, then remove the last acceptable set for real."""
    sizes = st.heads_per_layer(model)
    total = sum(sizes)
    scores = [s.tolist() for s in _score_heads(model, ctx)]
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
            metric = ctx.evaluate(model)[ctx.task.primary_metric]
        curve.append({"removed": k, "fraction": k / total, "metric": metric})
        if metric < floor:
            break
        accepted = plan
    st.prune_heads(model, accepted)
    ctx.log.append({"step": "heads (until)", "floor": floor, "curve": curve,
                    "removed": {str(l): h for l, h in accepted.items()}, "heads": st.heads_per_layer(model)})


def _prune_ffn(model, ctx: PruneContext) -> None:
    if ctx.cfg.ffn_criterion == "taylor":
        scores = ffn_importance_taylor(model, ctx.batches)
    else:
        scores = ffn_importance_magnitude(model)
    keep = ffn_to_keep([s.tolist() for s in scores], ctx.cfg.ffn, ctx.cfg.ffn_scope)
    prune_ffn_neurons(model, keep)  # torch-pruning's dependency graph finds the coupled weights
    ctx.log.append({"step": "ffn", "widths": st.ffn_widths(model), "dev": ctx.evaluate(model)})


def _recover(model, model_dir: Path, ctx: PruneContext, how: str):
    """Fine-tune the pruned model, or distil it from the unpruned one, through those stages."""
    scratch = Path(tempfile.mkdtemp(prefix="compress-prune-"))
    try:
        pruned = save_model_dir(model, scratch / "pruned", tokenizer=ctx.tokenizer,
                                record=compression_record(stage="prune", method="intermediate"))
        if how == "finetune":
            out = finetune(pruned, scratch / "recovered", FinetuneConfig(task=ctx.task.name, data=ctx.cfg.data, train=ctx.cfg.train))
        else:
            cfg = DistillConfig(task=ctx.task.name, init=str(pruned), losses=("kd", "hard"), data=ctx.cfg.data,
                                train=ctx.cfg.train)
            out = distill(model_dir, scratch / "recovered", cfg)
        return load_model_for_task(out, ctx.task)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _copy_into(target, source) -> None:
    target.load_state_dict(source.state_dict())


