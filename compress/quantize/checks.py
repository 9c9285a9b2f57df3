"""The int8 result checked against its fp32 parent: degenerate outputs, the accuracy guard and the embedding guard.

Nothing is trusted blindly: the output check runs both models on the calibration's first
``CHECK_EXAMPLES`` rows and raises on degenerate int8 outputs (NaN/inf, all zeros, one
constant output while the fp32 outputs vary). A guard then scores both models (a task's dev
split, or a sentence folder's held-out sentences and eval tasks), appends the scores to
metrics.json, sets compression.json's ``accuracy`` and returns the reason to reject, or None.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from compress.core.errors import CompressError
from compress.core.formats.records import append_metrics
from compress.core.formats.sentence import finish, pooled
from compress.core.model.structure import model_inputs
from compress.eval.embeddings import embedding_record
from compress.eval.embeddings import primary_metric as embedding_primary_metric
from compress.eval.evaluate import dev_evaluator, split_records
from compress.quantize.calibration import Calibration, SentenceCheck
from compress.quantize.config import QuantizeConfig
from compress.quantize.job import Job

CHECK_POSITIONS = 4  # per-token outputs (MLM logits) are compared on the first positions only
# An int8 output whose spread across examples is below this fraction of the fp32
# spread is "constant": the quantized model ignores its input.
CONSTANT_RATIO = 1e-3
COSINE_CHECK = "mean cosine to fp32"  # the check of a sentence-embedding folder's int8 (compression.json "accuracy")


def collect_outputs(model, batches: list[dict[str, Any]], names: tuple[str, ...]):
    """The model's outputs ``names`` on ``batches``, flattened per example: (examples, values) float64."""
    rows = []
    with torch.inference_mode():
        for batch in batches:
            out = model(**model_inputs(model, {k: torch.from_numpy(v) for k, v in batch.items()}))
            parts = []
            for name in names:
                value = getattr(out, name).float()
                if value.dim() == 3:
                    value = value[:, :CHECK_POSITIONS]  # (batch, positions, width): MLM logits are huge
                parts.append(value.reshape(value.shape[0], -1).cpu().numpy())
            rows.append(np.concatenate(parts, axis=1))
    return np.concatenate(rows).astype(np.float64)


def degenerate(reference, quantized) -> str | None:
    """Why the int8 outputs (examples, values) are unusable next to the fp32 ones, or None."""
    if not np.isfinite(quantized).all():
        return "NaN or infinite outputs"
    if not np.abs(quantized).any():
        return "all-zero outputs"
    fp32_spread = reference.std(axis=0).max()  # how much outputs vary across examples
    int8_spread = quantized.std(axis=0).max()
    if fp32_spread > 0 and int8_spread <= CONSTANT_RATIO * fp32_spread:
        return "the same output for every example while the fp32 outputs vary"
    return None


def check_outputs(reference, quantized, calibration: Calibration, names: tuple[str, ...], backend: str,
                  per_row: bool = True) -> dict[str, Any]:
    """Run fp32 and int8 side by side on the check examples; raise on degenerate int8 outputs.

    ``per_row``: the logits are one row per example (a sequence classifier), so their argmaxes agree or not.
    """
    batches = calibration.check_batches()
    ref = collect_outputs(reference, batches, names)
    if not np.isfinite(ref).all():  # nothing to compare with (and NaN - NaN passes no check): the fp32 model is broken
        raise CompressError(f"the fp32 model gives NaN or infinite outputs on {len(ref)} check examples, so its int8 "
                            "cannot be checked and was not written; check the fp32 model with compress eval")
    got = collect_outputs(quantized, batches, names)
    problem = degenerate(ref, got)
    if problem:
        raise CompressError(
            f"the {backend} backend produced {problem} on {len(ref)} check examples; the int8 model is "
            "unusable and was not written (try another --backend or --scheme)"
        )
    summary = {
        "examples": int(len(ref)),
        "outputs": list(names),
        "max_abs_diff": float(np.abs(got - ref).max()),
        "fp32_max_abs": float(np.abs(ref).max()),
    }
    if per_row and names == ("logits",) and ref.shape[1] > 1:
        summary["argmax_agreement"] = float((got.argmax(1) == ref.argmax(1)).mean())
    return summary


def accuracy_guard(job: Job, quantized, record: dict[str, Any]) -> str | None:
    """Score fp32 (``job.reference``) and int8 on ``job.dev``, append both to metrics.json in ``job.out`` and set
    ``record["accuracy"]``; the reason to reject, or None."""
    task, cfg, dev, max_length = job.task, job.cfg, job.dev, job.max_length
    evaluate = dev_evaluator(task, job.tokenizer, dev, max_length, batch_size=cfg.data.eval_batch_size, doc_stride=cfg.data.doc_stride)
    before, after = evaluate(job.reference), evaluate(quantized)
    metric = task.primary_metric
    drop = before[metric] - after[metric]  # in points: metrics are percentages
    passed = cfg.max_drop is None or drop <= cfg.max_drop
    batch_size = cfg.data.eval_batch_size  # scores of dynamic int8 move with batch composition: recorded
    for entry in split_records(task, dev, after, data=cfg.data.describe("dev"), max_length=max_length, batch_size=batch_size):
        append_metrics(job.out, entry)
    summary = {
        "kind": "quantize", "task": task.name, "metric": metric, "parent": before[metric], "quantized": after[metric],
        "drop": drop, "max_drop": cfg.max_drop, "passed": passed, "batch_size": batch_size, "check": record.get("check"),
        "parent_metrics": before, "quantized_metrics": after,
    }
    append_metrics(job.out, summary)
    record["accuracy"] = {k: summary[k] for k in ("task", "metric", "parent", "quantized", "drop", "max_drop", "passed", "batch_size")}
    if passed:
        return None
    return (
        f"int8 {task.display} dev {metric} dropped {drop:.2f} points ({before[metric]:.2f} -> {after[metric]:.2f}), "
        f"more than --max-drop {cfg.max_drop:g}: {advice(cfg)}"
    )


def advice(cfg: QuantizeConfig) -> str:
    """What to try after the guard refused this backend's int8 (one clause, for the refusal's line)."""
    if cfg.backend == "openvino":
        return "calibrate on more examples (--calibration-examples) or allow a larger --max-drop"
    if cfg.backend == "onnxruntime" and cfg.scheme == "static":
        return ("try --backend openvino (NNCF, whose accuracy control keeps the layers that cost accuracy in fp32) "
                "or --scheme dynamic")
    return "try --backend openvino --scheme static (NNCF, whose accuracy control keeps the layers that cost accuracy in fp32)"


def embedding_guard(job: Job, quantized, check: SentenceCheck, record: dict[str, Any]) -> str | None:
    """Embed the held-out sentences with fp32 and int8 and compare them by cosine, score any --eval-tasks,
    record both in compression.json and metrics.json; the reason to reject, or None."""
    cfg = job.cfg

    def embed(model) -> torch.Tensor:  # (sentences, d): pooled and normalised as the folder says
        return finish(pooled(model, job.tokenizer, check.sentences, check.spec, max_length=check.max_length), check.spec)

    cosine = torch.nn.functional.cosine_similarity(embed(quantized).double(), embed(job.reference).double(), dim=-1)  # (sentences,)
    mean, low = float(cosine.mean()), float(cosine.min())
    reasons = []
    if cfg.min_cosine is not None and mean < cfg.min_cosine:
        reasons.append(f"the int8 embeddings of {len(cosine)} held-out sentences have a mean cosine of {mean:.5f} to the "
                       f"fp32 ones, below --min-cosine {cfg.min_cosine:g}")
    tasks, reason = _embedding_task_scores(job, quantized, check)
    reasons += [reason] if reason else []
    accuracy = {"check": COSINE_CHECK, "sentences": len(cosine), "mean_cosine": mean, "min_cosine": low,
                "min_required": cfg.min_cosine, "max_length": check.max_length, "tasks": tasks, "max_drop": cfg.max_drop,
                "passed": not reasons}
    record["accuracy"] = accuracy
    summary = {k: v for k, v in accuracy.items() if k != "check"}
    append_metrics(job.out, {"kind": "quantize", "embedding": True, "measure": COSINE_CHECK, **summary,
                             "metrics": {"mean_cosine": mean, "min_cosine": low}, "check": record.get("check")})
    return f"{'; '.join(reasons)}: {advice(cfg)}" if reasons else None


def _embedding_task_scores(job: Job, quantized, check: SentenceCheck) -> tuple[dict, str | None]:
    """Each --eval-tasks dev score of the fp32 and the int8 embeddings (the int8 records appended to metrics.json),
    and the reason to reject (a drop above --max-drop), or None."""
    cfg = job.cfg
    tasks, reasons = {}, []
    for name, (task, ds, score) in check.scorers.items():
        (before, _), (after, details) = score(job.reference), score(quantized)
        append_metrics(job.out, embedding_record(task, "dev", len(ds), after, details, check.spec, data=cfg.data.describe("dev")))
        metric = embedding_primary_metric(task)
        drop = before[metric] - after[metric]  # in points: metrics are percentages
        tasks[name] = {"metric": metric, "parent": before[metric], "quantized": after[metric], "drop": drop}
        if cfg.max_drop is not None and drop > cfg.max_drop:
            reasons.append(f"int8 {task.display} dev {metric} of the embeddings dropped {drop:.2f} points "
                           f"({before[metric]:.2f} -> {after[metric]:.2f}), more than --max-drop {cfg.max_drop:g}")
    return tasks, "; ".join(reasons) or None
