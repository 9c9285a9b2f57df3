"""Evaluate a model directory on its task: GLUE / SQuAD with the official metrics, or a user's own.

``evaluate(model_dir, cfg)`` loads the model and the split, predicts in length-sorted
batches (less padding, same results), scores with ``compress.eval.metrics`` / ``compress.eval.squad``,
appends one record per split to the model's ``metrics.json``, writes the predictions (with
the task's label names; a token-classification split as CoNLL), and for GLUE test splits
the server's submission files. The task is the model's own unless ``--task`` names a
preset. With ``--embedding`` it scores the model's sentence embeddings instead (cosine,
no head; ``compress.eval.embeddings``).
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from compress.core.formats.folder import ModelFolder, open_folder
from compress.core.formats.layout import STATIC
from compress.core.formats.records import append_metrics, utc_now
from compress.core.formats.writes import atomic_path, check_writable, write_text_atomic
from compress.core.data.features import check_max_length, collate, squad_eval_features, tokenize_classification
from compress.core.data.sources import EVAL_BATCH_SIZE, load_split
from compress.core.errors import CompressError
from compress.core.logs import progress
from compress.core.formats.openvino import export_openvino
from compress.core.data.resolve import resolve_task, task_of_folder
from compress.core.formats.runtime import load_folder_model, load_model, model_device
from compress.core.formats.sentence import read_spec
from compress.core.model.structure import config_sizes, input_names
from compress.core.data.tasks import (
    UNLABELLED,
    Split,
    Task,
    get_task,
    is_kind,
)
from compress.core.data.token_data import Lost, encode_words, first_pieces, word_predictions
from compress.eval.config import EvalConfig
from compress.eval.embeddings import check_embedding_task, embedding_record, embedding_scorer
from compress.eval.metrics import task_metrics
from compress.eval.squad import postprocess_predictions, squad_v1_scores, squad_v2_scores, write_null_odds, write_predictions


def resolve_device(name: str):
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise CompressError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CompressError(f"device {name} requested but CUDA is not available; use --device cpu")
    return device


def data_source(cfg: EvalConfig):
    return cfg.source()


# ---------------------------------------------------------------------------- label mapping


def output_to_task_labels(config, task: Task) -> list[int]:
    """For each model output index, the task's label index (mapped through label names).

    A model fine-tuned elsewhere may order MNLI's labels differently; ids are never
    trusted across sources, names are. Generic names (LABEL_0, ...) mean task order.
    """
    if config.num_labels != task.num_labels:
        wanted = (f"has {task.num_labels} labels ({', '.join(task.label_names)})" if task.id2label
                  else f"is a {task.kind} task ({task.num_labels} output)")
        raise CompressError(
            f"the model has {config.num_labels} outputs but {task.display} {wanted}; is this a model for another task?"
        )
    if task.id2label is None:  # a score, not named labels: nothing to map
        return list(range(task.num_labels))
    names = [str(config.id2label.get(i, config.id2label.get(str(i), f"LABEL_{i}"))) for i in range(config.num_labels)]
    if all(n.startswith("LABEL_") for n in names):
        return list(range(task.num_labels))
    lowered = [n.lower() for n in names]
    task_names = [n.lower() for n in task.label_names]
    if sorted(lowered) != sorted(task_names):
        raise CompressError(
            f"the model's labels ({', '.join(names)}) are not {task.display}'s "
            f"({', '.join(task.label_names)}); is this a model for another task?"
        )
    return [task_names.index(n) for n in lowered]


# ---------------------------------------------------------------------------- prediction


def predict(model, features, collator, batch_size: int, device, *, outputs: tuple[str, ...] = ("logits",), desc="predicting",
            per_token: bool = False):
    """Run ``model`` over tokenised ``features`` in length-sorted batches.

    Returns one list per name in ``outputs``, in the original feature order; each item
    is a numpy array: a feature's logits (labels,), or with ``per_token`` (the head's outputs
    score token positions) its start/end logits (seq,) or its per-token logits (seq, labels),
    cut to the feature's own length.
    """

    model_inputs = set(input_names(model))  # DistilBERT and ModernBERT take no token_type_ids
    columns = [c for c in features.column_names if c in model_inputs]
    lengths = np.array([len(x) for x in features["input_ids"]])
    order = np.argsort(-lengths, kind="stable")  # longest first: memory peaks early
    rows = features.select_columns(columns)
    results = {name: [None] * len(features) for name in outputs}
    model.to(device)
    model.eval()
    with torch.inference_mode():
        for start in progress(range(0, len(order), batch_size), desc=desc, unit="batch", leave=False):
            index = order[start : start + batch_size]
            batch = collator([rows[int(i)] for i in index])
            batch = {k: v.to(device) for k, v in batch.items() if k in model_inputs}
            out = model(**batch)
            for name in outputs:
                values = getattr(out, name).float().cpu().numpy()  # (batch, labels) or (batch, seq)
                for j, i in enumerate(index):
                    row = values[j]
                    # Per-token outputs are cut back to the feature's own (unpadded) length.
                    results[name][int(i)] = row[: lengths[int(i)]] if per_token else row
    return [results[name] for name in outputs]


# ---------------------------------------------------------------------------- entry point


def evaluate(model_dir: str | Path, cfg: EvalConfig) -> list[dict[str, Any]]:
    """Evaluate ``model_dir`` on ``cfg.task`` (default: the model's own task); one result record per split evaluated."""
    folder = open_folder(model_dir)
    model_dir = folder.path
    task = eval_task(folder, cfg)
    splits = task.resolve_splits(cfg.split)
    if cfg.submission and any(s.submission_file is None for s in splits):
        raise CompressError("--submission writes GLUE server files from test predictions; use --split test")
    if cfg.embedding:
        return evaluate_embeddings(folder, task, splits, cfg)
    _check_destinations(model_dir, cfg)
    per_kind = _per_kind(task)
    check_head(folder, task)  # before load_model would put a fresh, untrained head on it
    per_kind.check(folder.config, task)  # outputs that do not fit the task, from config.json: before any data
    # Every split is read and checked before the weights and the tokenizer are loaded: a data error costs no model.
    data = {split.name: load_split(task, split.name, data_source(cfg), cfg.max_eval_examples) for split in splits}
    model = _load(folder, task.behaviour.head, cfg.runtime)
    tokenizer = folder.tokenizer
    model_max = config_sizes(model.config).max_positions
    max_length = cfg.max_length if cfg.max_length is not None else min(task.behaviour.max_length, model_max)
    check_max_length(max_length, model_max)
    device = resolve_device(cfg.device)

    records = []
    for split in splits:
        record = per_kind.evaluate_split(model, tokenizer, task, split, cfg, max_length=max_length, device=device,
                                         model_dir=model_dir, ds=data[split.name])
        if cfg.runtime != "auto":
            record["runtime"] = cfg.runtime
        if cfg.record and record.get("metrics"):
            append_metrics(model_dir, record)
        records.append(record)
    if cfg.submission and task.name == "mnli" and any(s.name.startswith("test") for s in splits):
        # The GLUE server scores AX (the diagnostic set) with the MNLI model's predictions.
        records.append(_ax_from_mnli(model, tokenizer, cfg, max_length, device, model_dir))
    return records


def eval_task(folder: ModelFolder, cfg: EvalConfig) -> Task:
    """The task to score: a preset ``--task``, else the model's own (a kind given must be the model's)."""
    if cfg.task and not is_kind(cfg.task):
        return resolve_task(cfg.task, cfg.own)
    if task_of_folder(folder) is None:
        raise CompressError(f"no --task given and {folder.path} records no task (its config.json has no task head); "
                            "pass --task, e.g. --task sst2, or evaluate a model fine-tuned on your task")
    return resolve_task(cfg.task, cfg.own, model=folder)


def _load(folder: ModelFolder, head: str, runtime: str):
    """The model as ``runtime`` runs it: its own format's loader, or OpenVINO after a conversion in a temporary folder."""
    if runtime == "auto":
        return load_folder_model(folder, head=head)
    fmt = folder.format
    if fmt not in ("torch", "onnx"):
        raise CompressError(f"--runtime {runtime} converts fp32 PyTorch or ONNX folders; {folder.path} is {fmt}, which runs "
                            "on its own runtime: drop --runtime")
    with tempfile.TemporaryDirectory(prefix="compress-eval-openvino-") as tmp:
        # The compiled model holds its weights: the IR can go with the folder.
        return load_model(export_openvino(folder.path, Path(tmp) / "openvino"), head=head)


def evaluate_embeddings(folder: ModelFolder, task: Task, splits: tuple[Split, ...], cfg: EvalConfig) -> list[dict[str, Any]]:
    """``--embedding``: score the directory's sentence embeddings on ``task``'s split(s); one record per split.

    Any format loads with its base model's ``last_hidden_state`` (int8 directories too); the
    pooling and normalisation come from the folder's sentence-transformers files.
    """
    check_embedding_task(task)  # fail before loading anything
    model_dir = folder.path
    if cfg.submission:
        raise CompressError("--submission writes GLUE server predictions; it does not apply to --embedding")
    if cfg.record:
        check_writable(model_dir, "results (metrics.json)", "pass --no-record to write nothing into the model, or copy it somewhere writable")
    for split in splits:
        if not split.labelled:
            raise CompressError(f"{task.display} {split.name} has no labels to score embeddings against; use --split dev")
    data = {split.name: load_split(task, split.name, data_source(cfg), cfg.max_eval_examples) for split in splits}
    model = load_folder_model(folder, head="base")
    tokenizer = folder.tokenizer
    spec = read_spec(model_dir)
    model_max = config_sizes(model.config).max_positions
    max_length = cfg.max_length if cfg.max_length is not None else spec.max_length(tokenizer, model_max)
    check_max_length(max_length, model_max)
    device = resolve_device(cfg.device)
    records = []
    for split in splits:
        ds = data[split.name]
        score = embedding_scorer(tokenizer, task, ds, spec, batch_size=cfg.eval_batch_size, max_length=max_length, device=device)
        metrics, details = score(model)
        record = embedding_record(task, split.name, len(ds), metrics, details, spec,
                                  data=data_source(cfg).description, max_length=max_length)
        if cfg.record:
            append_metrics(model_dir, record)
        records.append(record)
    return records


def check_head(folder: ModelFolder, task: Task) -> None:
    """Refuse a model whose saved head is not the one ``task`` is scored with (a question-answering
    model on SST-2, a classifier on SQuAD, a bare encoder): it would be scored through a fresh, random head."""
    if folder.format == STATIC:
        raise CompressError(f"{folder.path} is a static (model2vec) folder: token vectors with no task head; score its "
                            "sentence embeddings with --embedding (on a pair task such as stsb or mrpc)")
    head, wanted = folder.head, task.behaviour.head
    if head != wanted:
        has = "no task head (a bare encoder)" if head == "base" else f"a {head} head"
        raise CompressError(
            f"{folder.path} has {has} but {task.display} is scored with a {wanted} head; "
            f"evaluate it on a task its head was trained for, or fine-tune it on {task.display} first"
        )


def _ax_from_mnli(model, tokenizer, cfg, max_length, device, model_dir) -> dict[str, Any]:
    ax = get_task("ax")
    try:
        return _evaluate_glue(model, tokenizer, ax, ax.split("test"), cfg, max_length=max_length, device=device,
                              model_dir=model_dir)
    except CompressError as err:
        return {"kind": "eval", "task": "ax", "split": "test", "skipped": str(err)}


# ---------------------------------------------------------------------------- scorers


def glue_scorer(tokenizer, task: Task, ds, *, max_length: int, batch_size: int, device=None):
    """Tokenise ``ds`` once; return ``score(model) -> (metrics or None, predictions)``.

    Predictions are task label indices (floats for regression); metrics are None when
    the split has no labels. Fine-tuning and distillation call the scorer every epoch.
    """

    features = tokenize_classification(ds, task, tokenizer, max_length)
    labels = np.array(ds["label"])
    collator = collate(tokenizer)

    def score(model):
        mapping = output_to_task_labels(model.config, task)
        target = device if device is not None else model_device(model)
        (logits,) = predict(model, features, collator, batch_size, target, outputs=task.behaviour.outputs, desc=f"{task.display} eval",
                            per_token=task.behaviour.per_token)
        logits = np.stack(logits)  # (n, num_labels)
        # Reorder the model's outputs into the task's label order, then decide: argmax, a threshold or the score.
        task_logits = np.empty_like(logits)
        task_logits[:, mapping] = logits
        preds = _per_kind(task).decide(task, task_logits)
        metrics = task_metrics(task, preds, labels) if (labels != UNLABELLED).all() else None
        return metrics, preds

    return score


def token_scorer(tokenizer, task: Task, ds, *, max_length: int, batch_size: int, device=None):
    """Tokenise the sentences' words once; return ``score(model) -> (metrics or None, tags per sentence)``.

    A word's tag is the argmax at its first word piece (:mod:`compress.core.data.token_data`); a word
    with no piece left (past ``max_length``) is predicted ``O``. Metrics are entity-level (seqeval).
    """
    # deferred: a heavy import, paid only where it is used
    import datasets

    words = [list(w) for w in ds["tokens"]]
    enc = encode_words(tokenizer, words, max_length)
    features = datasets.Dataset.from_dict({k: enc[k] for k in enc.keys()})
    word_ids = [enc.word_ids(i) for i in range(len(words))]
    lost = Lost()
    for ids, sentence in zip(word_ids, words):
        lost.add(len(sentence), first_pieces(ids))
    lost.report(f"{task.display} eval", len(words), max_length)
    tags = [list(t) for t in ds["label"]]
    gold = None if any(t == UNLABELLED for row in tags for t in row) else [[task.label_names[t] for t in row] for row in tags]
    collator = collate(tokenizer)

    def score(model):
        mapping = output_to_task_labels(model.config, task)
        target = device if device is not None else model_device(model)
        (logits,) = predict(model, features, collator, batch_size, target, outputs=task.behaviour.outputs, desc=f"{task.display} eval",
                            per_token=task.behaviour.per_token)
        ordered = []
        for rows in logits:  # (pieces, labels) in the model's output order -> the task's label order
            reordered = np.empty_like(rows)
            reordered[:, mapping] = rows
            ordered.append(reordered)
        ids = word_predictions(ordered, word_ids, [len(w) for w in words])
        preds = [[task.label_names[i] if i >= 0 else "O" for i in row] for row in ids]
        return (task_metrics(task, preds, gold) if gold is not None else None), preds

    return score


def squad_scorer(
    tokenizer, task: Task, ds, *, max_length: int, doc_stride: int = 128, n_best: int = 20,
    max_answer_length: int = 30, null_threshold: float = 0.0, batch_size: int = EVAL_BATCH_SIZE, device=None,
):
    """Build SQuAD windows once; return ``score(model) -> (metrics, (predictions, null_odds))``."""

    features = squad_eval_features(ds, tokenizer, max_length, doc_stride)
    inputs = features.remove_columns(["offset_mapping", "example_id"])
    collator = collate(tokenizer)
    version_2 = task.unanswerable

    def score(model):
        target = device if device is not None else model_device(model)
        starts, ends = predict(
            model, inputs, collator, batch_size, target, outputs=task.behaviour.outputs, desc=f"{task.display} eval",
            per_token=task.behaviour.per_token,
        )
        width = max(len(s) for s in starts)
        start_logits = np.full((len(starts), width), -1e4, dtype=np.float32)  # (n_features, seq_len)
        end_logits = np.full_like(start_logits, -1e4)
        for i, (s, e) in enumerate(zip(starts, ends)):
            start_logits[i, : len(s)] = s
            end_logits[i, : len(e)] = e
        preds, null_odds = postprocess_predictions(
            ds, features, start_logits, end_logits, version_2=version_2, n_best=n_best,
            max_answer_length=max_answer_length, null_threshold=null_threshold,
        )
        metrics = squad_v2_scores(ds, preds, na_probs=null_odds) if version_2 else squad_v1_scores(ds, preds)
        metrics = {k: v for k, v in metrics.items() if k in task.metrics or k in ("total", "missing")}
        return metrics, (preds, null_odds)

    score.n_features = len(features)
    return score


def make_scorer(tokenizer, task: Task, ds, cfg: EvalConfig, max_length: int, device=None):
    """The task's scorer with the evaluation options of ``cfg``."""
    return _per_kind(task).scorer(tokenizer, task, ds, cfg, max_length, device)


def _glue_scorer(tokenizer, task: Task, ds, cfg: EvalConfig, max_length: int, device):
    return glue_scorer(tokenizer, task, ds, max_length=max_length, batch_size=cfg.eval_batch_size, device=device)


def _token_scorer(tokenizer, task: Task, ds, cfg: EvalConfig, max_length: int, device):
    return token_scorer(tokenizer, task, ds, max_length=max_length, batch_size=cfg.eval_batch_size, device=device)


def _squad_scorer(tokenizer, task: Task, ds, cfg: EvalConfig, max_length: int, device):
    return squad_scorer(
        tokenizer, task, ds, max_length=max_length, doc_stride=cfg.doc_stride, n_best=cfg.n_best,
        max_answer_length=cfg.max_answer_length, null_threshold=cfg.null_threshold,
        batch_size=cfg.eval_batch_size, device=device,
    )


def dev_evaluator(task: Task, tokenizer, dev: dict, max_length: int, *, batch_size: int = EVAL_BATCH_SIZE, doc_stride: int = 128):
    """``evaluate(model) -> metrics`` over the dev split(s): the first split's metrics as
    they are, the others prefixed (``dev_mismatched/accuracy`` for MNLI)."""
    cfg = EvalConfig(eval_batch_size=batch_size, doc_stride=doc_stride)
    scorers = {name: make_scorer(tokenizer, task, ds, cfg, max_length) for name, ds in dev.items()}
    first = next(iter(scorers))

    def evaluate_model(model) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, scorer in scorers.items():
            metrics, _ = scorer(model)
            for key, value in (metrics or {}).items():
                out[key if name == first else f"{name}/{key}"] = value
        return out

    return evaluate_model


def test_records(model, tokenizer, task: Task, test, data, max_length: int) -> list[dict[str, Any]]:
    """The kept model's scores on the ``--test-file`` examples ``test`` (none without them, or without labels)."""
    if test is None:
        return []
    cfg = EvalConfig(eval_batch_size=data.eval_batch_size, doc_stride=data.doc_stride)
    metrics, _ = make_scorer(tokenizer, task, test, cfg, max_length)(model)
    if not metrics:
        return []
    return [{"kind": "eval", "task": task.name, "split": "test", "n": len(test), "metrics": metrics,
             "data": data.test_file, "max_length": max_length, "batch_size": data.eval_batch_size, "when": utc_now()}]


def split_records(task: Task, dev: dict, metrics: dict[str, float], **extra) -> list[dict[str, Any]]:
    """metrics.json records (one per dev split) from a :func:`dev_evaluator` result."""
    records = []
    for i, name in enumerate(dev):
        prefix = "" if i == 0 else f"{name}/"
        own = {k[len(prefix):]: v for k, v in metrics.items() if (k.startswith(prefix) if prefix else "/" not in k)}
        if own:
            records.append({"kind": "eval", "task": task.name, "split": name, "n": len(dev[name]),
                            "metrics": own, "when": utc_now(), **extra})
    return records


def _evaluate_glue(model, tokenizer, task: Task, split: Split, cfg: EvalConfig, *, max_length, device, model_dir, ds=None):
    """One split of a task with labels (GLUE, a user's classes, scores, label sets or tags): metrics and prediction files.

    ``ds``: the split as read already (None: read here)."""
    ds = ds if ds is not None else load_split(task, split.name, data_source(cfg), cfg.max_eval_examples)
    metrics, preds = make_scorer(tokenizer, task, ds, cfg, max_length, device)(model)
    record: dict[str, Any] = {
        "kind": "eval",
        "task": task.name,
        "split": split.name,
        "n": len(ds),
        "data": data_source(cfg).description,
        "max_length": max_length,
        "batch_size": cfg.eval_batch_size,
    }
    if metrics is not None:
        record["metrics"] = metrics
    elif split.labelled:
        raise CompressError(f"{task.display} {split.name} has examples without labels; check the data file")
    out = predictions_dir(cfg, model_dir)
    if out is not None:
        record["predictions"] = str(_per_kind(task).write(out, task, split, ds, preds))
    if cfg.submission and split.submission_file:
        record["submission"] = str(write_submission(Path(cfg.submission), task, split, ds["idx"], preds))
    return record


def _evaluate_squad(model, tokenizer, task: Task, split: Split, cfg: EvalConfig, *, max_length, device, model_dir, ds):
    """One SQuAD split (``ds``, read already): metrics and the predictions files."""
    scorer = make_scorer(tokenizer, task, ds, cfg, max_length, device)
    metrics, (preds, null_odds) = scorer(model)
    out = predictions_dir(cfg, model_dir)
    record = {
        "kind": "eval",
        "task": task.name,
        "split": split.name,
        "n": len(ds),
        "n_features": scorer.n_features,
        "data": data_source(cfg).description,
        "max_length": max_length,
        "doc_stride": cfg.doc_stride,
        "batch_size": cfg.eval_batch_size,
        "metrics": metrics,
    }
    if out is not None:
        record["predictions"] = str(write_predictions(out / f"{task.name}_{split.name}.json", preds))
        if task.unanswerable:
            record["null_odds"] = str(write_null_odds(out / f"{task.name}_{split.name}_null_odds.json", null_odds))
    return record


def _check_destinations(model_dir: Path, cfg: EvalConfig) -> None:
    """Every place eval will write, checked before the model is loaded: the model's metrics.json, predictions, submission."""
    if cfg.record:
        check_writable(model_dir, "results (metrics.json)", "pass --no-record to write nothing into the model, or copy it somewhere writable")
    where = predictions_dir(cfg, model_dir)
    if where is not None:
        check_writable(where, "--predictions", "pass a directory that can be written (or --no-record)")
    if cfg.submission:
        check_writable(cfg.submission, "--submission", "pass a directory that can be written")


def predictions_dir(cfg: EvalConfig, model_dir: Path) -> Path | None:
    """Where prediction files go: --predictions, else MODEL/predictions, or nowhere with --no-record and no --predictions."""
    if cfg.predictions:
        return Path(cfg.predictions)
    return Path(model_dir) / "predictions" if cfg.record else None


# ---------------------------------------------------------------------------- output files


def format_prediction(task: Task, value) -> str:
    """One prediction as the GLUE server wants it: 0/1, a label name, or a %.3f score."""
    return _per_kind(task).format(task, value)


def _format_label(task: Task, value) -> str:
    if task.submission_labels == "names":
        return task.label_names[int(value)]
    return str(int(value))


def _format_labels(task: Task, value) -> str:
    """A multi-hot row as its label names: joined by the task's separator, else a JSON list."""
    names = [task.label_names[i] for i, on in enumerate(value) if on]
    return task.label_sep.join(names) if task.label_sep else json.dumps(names, ensure_ascii=False)


def _format_score(task: Task, value) -> str:
    lo, hi = task.label_range or (float("-inf"), float("inf"))
    return f"{min(max(float(value), lo), hi):.3f}"


def write_glue_predictions(out: Path, task: Task, split: Split, idx, preds) -> Path:
    lines = ["index\tprediction"] + [f"{int(i)}\t{format_prediction(task, p)}" for i, p in zip(idx, preds)]
    path = out / f"{task.name}_{split.name}.tsv"
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def _write_table(out: Path, task: Task, split: Split, ds, preds) -> Path:
    return write_glue_predictions(out, task, split, ds["idx"], preds)


def write_conll_predictions(out: Path, task: Task, split: Split, ds, preds: list[list[str]]) -> Path:
    """``token<TAB>predicted tag`` per line, an empty line after each sentence: CoNLL, readable as data again."""
    lines = []
    for words, tags in zip(ds["tokens"], preds):
        lines += [f"{w}\t{t}" for w, t in zip(words, tags)] + [""]
    path = out / f"{task.name}_{split.name}.conll"
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


SUBMISSION_FILES = (
    "AX.tsv", "CoLA.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "MRPC.tsv", "QNLI.tsv",
    "QQP.tsv", "RTE.tsv", "SST-2.tsv", "STS-B.tsv", "WNLI.tsv",
)


def write_submission(out: Path, task: Task, split: Split, idx, preds) -> Path:
    """Write ``out/<TASK>.tsv`` (``index\\tprediction``) and rebuild ``out/submission.zip``.

    Run ``compress eval --split test --submission OUT`` once per task with the same OUT;
    the zip always holds every TSV written so far, flat, as the GLUE server expects.
    """
    lines = ["index\tprediction"] + [f"{int(i)}\t{format_prediction(task, p)}" for i, p in zip(idx, preds)]
    path = out / split.submission_file
    write_text_atomic(path, "\n".join(lines) + "\n")
    build_submission_zip(out)
    return path


def build_submission_zip(out: Path) -> Path:
    zip_path = out / "submission.zip"
    with atomic_path(zip_path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in SUBMISSION_FILES:
            if (out / name).is_file():
                zf.write(out / name, arcname=name)
    return zip_path


def missing_submission_files(out: Path) -> list[str]:
    return [name for name in SUBMISSION_FILES if not (Path(out) / name).is_file()]


def format_table(records: list[dict[str, Any]]) -> str:
    """Evaluation records as a plain-text table: task, split, n, metric, value."""
    rows = [("task", "split", "n", "metric", "value")]
    for r in records:
        for name, value in (r.get("metrics") or {}).items():
            if name in ("n", "total", "missing"):
                continue
            rows.append((r["task"], r["split"], str(r.get("n", "")), name, f"{value:.2f}" if isinstance(value, float) else str(value)))
        if not r.get("metrics") and "skipped" not in r:
            rows.append((r["task"], r["split"], str(r.get("n", "")), "(no labels)", "predictions only"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def summarize(records: list[dict[str, Any]], cfg: EvalConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress eval`` prints: the table, and notes on skipped splits and where files went."""
    notes = []
    for r in records:
        if "skipped" in r:
            notes.append(f"note: {r['task']} {r['split']} skipped: {r['skipped']}")
        elif "predictions" in r:
            notes.append(f"predictions: {r['predictions']}")
    if cfg.submission:
        missing = missing_submission_files(cfg.submission)
        notes.append(f"submission files in {cfg.submission}; zip: {cfg.submission}/submission.zip")
        if missing:
            notes.append(f"still missing for a complete GLUE submission: {', '.join(missing)}")
    if cfg.record and any(r.get("metrics") for r in records):
        notes.append(f"results appended to {inputs['model']}/metrics.json")
    return format_table(records), notes


# ---------------------------------------------------------------------------- per kind of task


@dataclass(frozen=True)
class _KindEval:
    """How one kind of task is evaluated."""

    check: Callable  # (model config, task) -> refuse a model made for another task, before any data loads
    scorer: Callable  # (tokenizer, task, dataset, EvalConfig, max_length, device) -> score(model)
    evaluate_split: Callable  # (model, tokenizer, task, split, cfg, *, max_length, device, model_dir, ds) -> record
    decide: Callable | None  # (task, (n, outputs) logits in the task's label order) -> predictions; None: spans, tags
    format: Callable | None  # (task, prediction) -> its text in prediction and GLUE server files; None: spans, tags
    write: Callable | None = None  # (out dir, task, split, dataset, predictions) -> the predictions file; None: spans


def _any_model(config, task: Task) -> None:
    """A span head has no label names or count to check."""


def _above_threshold(task: Task, logits: np.ndarray) -> np.ndarray:
    """Multi-hot predictions (n, labels): sigmoid(logit) >= threshold."""
    return (1 / (1 + np.exp(-logits)) >= task.threshold).astype(int)


# Sentence tasks, token tasks and SQuAD are scored by three different algorithms (one
# prediction per example; one per word, read at its first piece; answer spans gathered over
# context windows), and a label is an argmax, a label set a threshold, a score the one output.
# This table, keyed by what one prediction is (``TaskKind.prediction``), is the module's one dispatch on the kind.
_BY_PREDICTION: dict[str, _KindEval] = {
    "label": _KindEval(output_to_task_labels, _glue_scorer, _evaluate_glue, lambda task, logits: logits.argmax(axis=1),
                       _format_label, _write_table),
    "labels": _KindEval(output_to_task_labels, _glue_scorer, _evaluate_glue, _above_threshold, _format_labels,
                        _write_table),
    "score": _KindEval(output_to_task_labels, _glue_scorer, _evaluate_glue, lambda task, logits: logits[:, 0],
                       _format_score, _write_table),
    "tags": _KindEval(output_to_task_labels, _token_scorer, _evaluate_glue, None, None, write_conll_predictions),
    "answer": _KindEval(_any_model, _squad_scorer, _evaluate_squad, None, None),
}


def _per_kind(task: Task) -> _KindEval:
    """How ``task`` is evaluated: by what one of its predictions is (a label, labels, a score, tags, an answer)."""
    return _BY_PREDICTION[task.behaviour.prediction]
