"""Attention-head analysis: what each head looks at, how much it matters, and what masking costs.

``analyze_heads(model_dir, out, cfg) -> out`` runs a model over some inputs with
``output_attentions=True`` (eager attention) and writes plots, ``heads.json`` and
``summary.md`` to ``out``.

* What heads look at, after Clark et al. 2019, "What Does BERT Look At? An Analysis of
  BERT's Attention": per head the entropy of its attention rows, the mass it puts on
  [CLS], [SEP] and punctuation and on the previous / same / next token, the mean
  attention distance, and the Jensen-Shannon distance between every pair of heads,
  embedded in 2-D with MDS.
* How much heads matter, after Michel et al. 2019, "Are Sixteen Heads Really Better than
  One?": the gate-gradient importance of ``compress.core.model.importance`` (with a task: ``--task``, or
  a model of your own task given its ``--train-file``/``--dev-file``; the task's own loss, per
  token for token classification; with ``--text`` there are no labels, so the weight-magnitude
  criterion stands in), and the
  pruning curve: the dev metric as a growing fraction of heads is masked (hooks, no
  surgery) in increasing order of importance versus a seeded random order. Importance is
  computed once, before any head is masked.

Conventions. ``att[b, h, i, j]`` is how much query token ``i`` attends to key token
``j`` (rows sum to 1); masks are 1 for real tokens and 0 for padding. Pruned models have
a different number of heads per layer, so per-layer results are lists of per-head lists,
never a rectangular (layers, heads) array, except in the heatmaps, where missing heads
are blank. Heads are named ``L{layer}H{head}`` with the 0-based ids of the unpruned model.
"""

from __future__ import annotations

import inspect
import math
import random
import string
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from sklearn.manifold import MDS

from compress.core.model import structure as st
from compress.core.formats.artifacts import artifact_format, is_quantized, load_tokenizer, output_dir
from compress.core.formats.layout import TORCH
from compress.core.formats.records import parent_path, read_compression, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.preflight import check_output, require_model_dir
from compress.core.data.features import check_max_length, collate, encode_examples, train_features
from compress.core.data.sources import TaskData, load_dev_splits, load_split, load_train_split
from compress.core.errors import CompressError
from compress.core.model.importance import head_importance_gradient, head_importance_magnitude, heads_to_remove, masked_heads
from compress.core.logs import progress
from compress.core.data.resolve import resolve_task
from compress.core.formats.runtime import load_model, load_model_for_task
from compress.core.data.tasks import Task
from compress.eval.config import HeadsConfig
from compress.eval.evaluate import dev_evaluator
from compress.eval.plots import _pyplot, save_figure

PUNCTUATION = frozenset(string.punctuation)
DEFAULT_TEXT_LENGTH = 128  # tokens per input with --text when --max-length is not given


# ---------------------------------------------------------------------------- statistics (pure)


def _batched(att: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, heads, seq, seq) attention and a (batch, seq) float mask from batched or single inputs."""
    if att.dim() == 3:  # one input: (heads, seq, seq)
        att = att.unsqueeze(0)
    if att.dim() != 4 or att.shape[-1] != att.shape[-2]:
        raise ValueError(f"attention must be (batch, heads, seq, seq), got {tuple(att.shape)}")
    if mask is None:
        mask = torch.ones(att.shape[0], att.shape[-1])
    if mask.dim() == 1:
        mask = mask.unsqueeze(0)
    return att.float(), mask.to(att.device, torch.float32)


def _row_mean(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Per-head mean of ``values`` (batch, heads, seq) over the query rows where ``rows`` (batch, seq) is 1."""
    weight = rows[:, None, :]  # (batch, 1, seq): the same rows count for every head
    return (values * weight).sum(dim=(0, 2)) / weight.sum().clamp_min(1.0)


def _offset_rows(mask: torch.Tensor, offset: int) -> torch.Tensor:
    """(batch, seq - |offset|): 1 where both the query token and the token at ``offset`` from it are real."""
    k = abs(offset)
    n = mask.shape[-1]
    return mask[:, : n - k] * mask[:, k:]


def entropy(att: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention rows, over real query tokens.

    ``att``: (batch, heads, seq, seq) or (heads, seq, seq); ``mask``: (batch, seq) or (seq,),
    1 for real tokens (None: all real). Returns (heads,). A head attending uniformly over
    n tokens scores log(n); one that always attends to a single token scores 0.
    """
    att, mask = _batched(att, mask)
    rows = -torch.xlogy(att, att).sum(-1)  # (batch, heads, seq); 0 log 0 = 0
    return _row_mean(rows, mask)


def attention_to(att: torch.Tensor, positions_mask: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean attention mass each head puts on a set of key positions ([CLS], [SEP], punctuation).

    ``att``: (batch, heads, seq, seq) or (heads, seq, seq); ``positions_mask``: (batch, seq)
    or (seq,), 1 on the target tokens; ``mask``: real tokens as in :func:`entropy`.
    Returns (heads,): 1.0 for a head that only ever looks at the targets.
    """
    att, mask = _batched(att, mask)
    targets = positions_mask.to(att.device, torch.float32)
    if targets.dim() == 1:
        targets = targets.unsqueeze(0)
    mass = (att * targets[:, None, None, :]).sum(-1)  # (batch, heads, seq): mass per query row
    return _row_mean(mass, mask)


def offset_attention(att: torch.Tensor, offset: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean attention mass each head puts on the token at relative ``offset`` (-1 previous, 0 same, +1 next).

    ``att``: (batch, heads, seq, seq) or (heads, seq, seq); ``mask``: (batch, seq) or (seq,).
    Averages over the query rows whose target token exists and is real (the first token
    has no previous one), so a pure next-token head scores 1.0. Returns (heads,).
    """
    att, mask = _batched(att, mask)
    n = att.shape[-1]
    if abs(offset) >= n:
        return torch.zeros(att.shape[1])
    diag = torch.diagonal(att, offset=offset, dim1=-2, dim2=-1)  # (batch, heads, seq - |offset|)
    return _row_mean(diag, _offset_rows(mask, offset))


def mean_distance(att: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean distance |i - j| in tokens between a query and the keys it attends to, weighted by attention.

    ``att``: (batch, heads, seq, seq) or (heads, seq, seq); ``mask``: (batch, seq) or (seq,).
    Returns (heads,); a layer's value is the mean over its heads (every head of a layer
    sees the same rows). An identity head scores 0, a next-token head 1.
    """
    att, mask = _batched(att, mask)
    pos = torch.arange(att.shape[-1], dtype=att.dtype, device=att.device)
    dist = (pos[:, None] - pos[None, :]).abs()  # (seq, seq)
    return _row_mean((att * dist).sum(-1), mask)  # (batch, heads, seq) -> (heads,)


def js_distance(p: torch.Tensor, q: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Jensen-Shannon distance between two heads' attention, averaged over query rows.

    ``p``, ``q``: (..., seq, seq) attention (broadcastable); ``mask``: (seq,), 1 for the
    query rows to average over (None: all). Per row the distance is the square root of
    the JS divergence with base-2 logs, so it lies in [0, 1]: 0 for identical rows, 1 for
    rows with disjoint support. Returns (...): a scalar for two (seq, seq) heads.
    """
    p, q = p.float(), q.float()
    m = (p + q) / 2
    kl_p = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)  # (..., seq) in nats; p > 0 implies m > 0
    kl_q = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(-1)
    rows = ((kl_p + kl_q) / (2 * math.log(2))).clamp(0.0, 1.0).sqrt()  # (..., seq)
    if mask is None:
        return rows.mean(-1)
    w = mask.to(rows.device, torch.float32)
    return (rows * w).sum(-1) / w.sum().clamp_min(1.0)


def _flush_subnormal(att: torch.Tensor) -> torch.Tensor:
    """``att`` with values below 1e-30 set to 0.

    Softmax leaves subnormal floats where a head ignores a token; CPU arithmetic on them
    is many times slower (a real model's JS matrix went from 1.8 s to 0.1 s per input)
    and they carry no attention mass.
    """
    return att.masked_fill(att < 1e-30, 0.0)


def head_js_matrix(layers: Sequence[torch.Tensor]) -> torch.Tensor:
    """Head x head Jensen-Shannon distances on one input (Clark et al.'s head embedding).

    ``layers``: one (heads_l, n, n) tensor per layer, real tokens only (heads may differ
    per layer). Returns (H, H) with H the total number of heads, in layer order.
    """
    heads = _flush_subnormal(torch.cat([a.float() for a in layers], dim=0))  # (H, n, n)
    total = heads.shape[0]
    # JS(p, q) = H((p + q) / 2) - (H(p) + H(q)) / 2: the same value as js_distance with one
    # entropy per pair instead of two KL terms, as this is the analysis' inner loop.
    own = -torch.xlogy(heads, heads).sum(-1)  # (H, n): entropy of each row, nats
    out = torch.zeros(total, total)
    for i in range(total - 1):
        mix = (heads[i].unsqueeze(0) + heads[i + 1 :]) / 2  # (H - i - 1, n, n)
        jsd = (-torch.xlogy(mix, mix).sum(-1) - (own[i] + own[i + 1 :]) / 2) / math.log(2)  # (H - i - 1, n)
        d = jsd.clamp(0.0, 1.0).sqrt().mean(-1)  # (H - i - 1,)
        out[i, i + 1 :] = d
        out[i + 1 :, i] = d
    return out


def js_distance_matrix(inputs: Iterable[Sequence[torch.Tensor]]) -> torch.Tensor:
    """Head x head Jensen-Shannon distance averaged over a sample of inputs.

    ``inputs``: per input, one (heads_l, n, n) tensor per layer (see :func:`head_js_matrix`).
    Returns (H, H).
    """
    total, count = None, 0
    for layers in inputs:
        m = head_js_matrix(layers)
        total = m if total is None else total + m
        count += 1
    if total is None:
        raise ValueError("no inputs to compare heads on")
    return total / count


def is_punctuation(token: str) -> bool:
    """True for tokens made only of characters in ``string.punctuation`` ("." "," "?!" ...)."""
    return bool(token) and all(c in PUNCTUATION for c in token)


# ---------------------------------------------------------------------------- model and inputs


def head_ids(model) -> tuple[list[int], list[list[int]]]:
    """(original layer ids, original head ids per current layer): pruned heads keep their names."""
    s = st.describe(model)
    n_orig = st.config_sizes(model.config).heads
    ids = []
    for layer, n in enumerate(s["heads"]):
        removed = set(s["pruned_heads"].get(str(layer), []))
        kept = [h for h in range(n_orig) if h not in removed]
        ids.append(kept if len(kept) == n else list(range(n)))
    return list(s["kept_layers"]), ids


def _load_model(model_dir: Path, task):
    """The model with eager attention (``output_attentions`` needs it) and, with a task, its trained head."""
    if task is None:
        return load_model(model_dir, attn_implementation="eager")
    model, info = load_model_for_task(model_dir, task, attn_implementation="eager", with_info=True)
    if any(k.startswith(("classifier.", "qa_outputs.")) for k in info["new_weights"]):
        raise CompressError(
            f"{model_dir} has no trained {task.display} head, so importance and the pruning curve would be noise; "
            "fine-tune it first or pass --text FILE to analyse its attention alone"
        )
    return model


def read_text_inputs(path: Path, limit: int) -> list[tuple[str, ...]]:
    """The first ``limit`` non-empty lines of a UTF-8 file; a tab splits a line into a sentence pair."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise CompressError(f"--text {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    inputs = [tuple(p.strip() for p in line.split("\t", 1)) for line in lines if line.strip()]
    if not inputs:
        raise CompressError(f"--text {path} has no non-empty lines; write one input per line")
    return inputs[:limit]


def encode_inputs(tokenizer, texts: Sequence[tuple[str, ...]], max_length: int) -> list[dict[str, list[int]]]:
    """Tokenise single texts or pairs, truncated to ``max_length`` tokens (no padding)."""
    out = []
    for parts in texts:
        enc = tokenizer(*parts[:2], truncation=True, max_length=max_length)
        out.append({k: list(v) for k, v in enc.items() if k in ("input_ids", "token_type_ids", "attention_mask")})
    return out


def task_encodings(task: Task, tokenizer, data: TaskData, limit: int, max_length: int) -> tuple[list[dict[str, list[int]]], str]:
    """The first ``limit`` examples of the task's (first) dev split encoded as its model reads them (a tagged
    sentence as its words, SQuAD's question whole), and where they came from."""
    _, dev_source = data.sources()
    split = task.resolve_splits("dev")[0].name
    ds = load_split(task, split, dev_source, limit)
    enc = encode_examples(task, tokenizer, ds, max_length)
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
    rows = [{k: list(enc[k][i]) for k in keys} for i in range(len(enc["input_ids"]))]
    return rows, f"{task.display} {split} from {data.describe()}"


# ---------------------------------------------------------------------------- extraction


OFFSETS = {"previous": -1, "same": 0, "next": 1}
STATISTICS = ("entropy", "cls", "sep", "punctuation", "previous", "same", "next", "distance")


@dataclass
class AttentionStats:
    """Per-head statistics (one list per layer, one value per head) over the analysed inputs."""

    per_head: dict[str, list[list[float]]]
    uniform_entropy: float  # mean over real query rows of log(n): the entropy of uniform attention
    js: list[list[float]]  # (H, H) head x head Jensen-Shannon distance, heads in layer order
    n_inputs: int
    n_js_inputs: int
    mean_tokens: float


def attention_statistics(model, tokenizer, encodings: Sequence[dict], *, batch_size: int = 16,
                         js_examples: int = 32) -> AttentionStats:
    """Run ``model`` over ``encodings`` with ``output_attentions`` and average every statistic per head.

    Batches are length-sorted and padded; each statistic is accumulated as a sum over
    the rows it averages, so the result equals one average over all inputs. The first
    ``js_examples`` inputs (in the given order) also feed the Jensen-Shannon matrix.
    """

    device = next(model.parameters()).device
    sizes = st.heads_per_layer(model)
    punct = torch.tensor(sorted(i for t, i in tokenizer.get_vocab().items() if is_punctuation(t)), dtype=torch.long)
    sums = {name: [torch.zeros(n) for n in sizes] for name in STATISTICS}
    counts = {name: 0.0 for name in STATISTICS}
    uniform = 0.0
    js_sum, js_n = None, 0
    pad = collate(tokenizer)
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i]["input_ids"]))
    model.eval()
    with torch.inference_mode():
        for start in progress(range(0, len(order), batch_size), desc="attention statistics", unit="batch", leave=False):
            index = order[start : start + batch_size]
            batch = {k: v.to(device) for k, v in pad([encodings[i] for i in index]).items()}
            attentions = model(**st.model_inputs(model, batch), output_attentions=True).attentions  # per layer (batch, heads, seq, seq)
            if attentions is None or attentions[0] is None:
                raise CompressError("the model returned no attention weights; it must run with eager attention")
            ids, mask = batch["input_ids"].cpu(), batch["attention_mask"].float().cpu()  # (batch, seq)
            targets = {"cls": ids == tokenizer.cls_token_id, "sep": ids == tokenizer.sep_token_id,
                       "punctuation": torch.isin(ids, punct)}
            rows = {name: mask.sum().item() for name in STATISTICS}
            rows.update({name: _offset_rows(mask, off).sum().item() for name, off in OFFSETS.items()})
            lengths = mask.sum(1)  # (batch,)
            uniform += (lengths * lengths.log()).sum().item()
            attentions = [_flush_subnormal(a.float().cpu()) for a in attentions]  # per layer (batch, heads, seq, seq)
            for layer, att in enumerate(attentions):
                values = {"entropy": entropy(att, mask), "distance": mean_distance(att, mask)}
                values.update({name: attention_to(att, t, mask) for name, t in targets.items()})
                values.update({name: offset_attention(att, off, mask) for name, off in OFFSETS.items()})
                for name, v in values.items():
                    sums[name][layer] += v * rows[name]  # back to a sum over rows, for exact pooling
            for name in STATISTICS:
                counts[name] += rows[name]
            for j, i in enumerate(index):
                if i < js_examples:
                    n = int(lengths[j])
                    m = head_js_matrix([a[j, :, :n, :n] for a in attentions])  # (H, H)
                    js_sum = m if js_sum is None else js_sum + m
                    js_n += 1
    per_head = {name: [(s / max(counts[name], 1.0)).tolist() for s in sums[name]] for name in STATISTICS}
    tokens = counts["entropy"]
    return AttentionStats(
        per_head=per_head, uniform_entropy=uniform / max(tokens, 1.0),
        js=(js_sum / max(js_n, 1)).tolist() if js_sum is not None else [], n_inputs=len(encodings),
        n_js_inputs=js_n, mean_tokens=tokens / max(len(encodings), 1),
    )


# ---------------------------------------------------------------------------- importance and the pruning curve


def pruning_curve(model, evaluate, metric: str, scores: Sequence[Sequence[float]], steps: int = 10,
                  seed: int = 0) -> list[dict[str, Any]]:
    """Michel et al.'s figure: the dev metric with fractions 0, 1/steps, ... of heads masked.

    Heads go in increasing order of ``scores`` (computed once, before masking) and in a
    seeded random order; both orders never mask a layer's last head, so the largest
    fractions may be capped (``removed`` says how many heads were actually masked).
    ``evaluate(model) -> {metric: value}``. Returns one row per fraction.
    """

    sizes = st.heads_per_layer(model)
    total, removable = sum(sizes), sum(sizes) - len(sizes)
    rng = random.Random(seed)
    orders = {"importance": [list(map(float, s)) for s in scores],
              "random": [[rng.random() for _ in range(n)] for n in sizes]}
    base = evaluate(model)[metric]
    rows: list[dict[str, Any]] = []
    for k in progress(range(steps), desc="pruning curve", unit="point", leave=False):
        count = min(int(round(total * k / steps)), removable)
        row: dict[str, Any] = {"fraction": count / total, "removed": count, "requested": k / steps}
        if rows and rows[-1]["removed"] == count:  # capped: the same heads as the previous point
            rows.append({**rows[-1], "requested": k / steps})
            continue
        for name, order in orders.items():
            if count == 0:
                row[name] = base
                continue
            plan = heads_to_remove(order, count, "global")
            keep = [[h not in plan.get(layer, ()) for h in range(n)] for layer, n in enumerate(sizes)]
            with masked_heads(model, keep):
                row[name] = evaluate(model)[metric]
        rows.append(row)
    return rows


def _importance(model, task, tokenizer, cfg: HeadsConfig, max_length: int, data: tuple | None = None):
    """(per-layer scores, criterion name, criterion sentence, dev splits, evaluator).

    Michel et al.'s gate gradient with a task, on ``data`` (its training sample and dev splits, read already); the
    weight magnitude without one (no labels).
    """

    if task is None:
        scores = head_importance_magnitude(model)
        return [s.tolist() for s in scores], "magnitude", (
            "weight magnitude (L2 norm of each head's Q/K/V rows and output columns): --text gives no labels "
            "for Michel et al.'s gradient criterion"), None, None

    train, dev = data
    features = train_features(train, task, tokenizer, max_length, doc_stride=cfg.data.doc_stride)
    pad = collate(tokenizer, task)  # per-token labels pad with -100
    rows = [features[i] for i in range(len(features))]
    batches = [pad(rows[i : i + cfg.attention_batch_size]) for i in range(0, len(rows), cfg.attention_batch_size)]
    scores = head_importance_gradient(model, progress(batches, desc="head importance", unit="batch", leave=False))
    criterion = (f"Michel et al.'s gate gradient |dL/dg| summed over {len(rows)} {task.display} training examples "
                 "(seeded sample), normalised per layer")
    evaluate = dev_evaluator(task, tokenizer, dev, max_length, batch_size=cfg.data.eval_batch_size,
                             doc_stride=cfg.data.doc_stride)
    return [s.tolist() for s in scores], "gradient", criterion, dev, evaluate


def _task_splits(task: Task, cfg: HeadsConfig) -> tuple:
    """(the seeded training sample that scores importance, the dev splits of the curve), as read from the task's data."""
    data = replace(cfg.data, max_train_examples=cfg.importance_examples)
    return load_train_split(task, data, seed=cfg.seed), load_dev_splits(task, data)


# ---------------------------------------------------------------------------- entry point


def analyze_heads(model_dir: str | Path, out: str | Path, cfg: HeadsConfig, overwrite: bool = False) -> Path:
    """Analyse the attention heads of ``model_dir`` and write plots, heads.json and summary.md to ``out``."""
    cfg.validate()
    out = check_output(out, overwrite, inputs=(model_dir, cfg))
    model_dir = require_model_dir(model_dir)
    if is_quantized(model_dir) or artifact_format(model_dir) != TORCH:
        parent = parent_path(read_compression(model_dir))
        raise CompressError(f"{model_dir} is an int8 or exported model, whose attention maps cannot be read; analyse the fp32 "
                            f"model it was made from" + (f" ({parent})" if parent else ""))
    started = time.perf_counter()
    task = resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file, model=model_dir) if cfg.has_task else None
    data = _task_splits(task, cfg) if task is not None else None  # read and checked before the tokenizer and the weights
    tokenizer = load_tokenizer(model_dir)
    model = _load_model(model_dir, task)
    model_max = st.config_sizes(model.config).max_positions
    if task is not None:
        max_length = cfg.data.resolved_max_length(task, model_max)
    else:
        max_length = cfg.data.max_length or min(DEFAULT_TEXT_LENGTH, model_max)
        check_max_length(max_length, model_max)
    if task is not None:
        encodings, source = task_encodings(task, tokenizer, cfg.data, cfg.attention_examples, max_length)
    else:
        text = Path(cfg.text)
        encodings, source = encode_inputs(tokenizer, read_text_inputs(text, cfg.attention_examples), max_length), str(text)

    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    stats = attention_statistics(model, tokenizer, encodings, batch_size=cfg.attention_batch_size, js_examples=cfg.js_examples)
    timing["statistics"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    scores, method, criterion, dev, evaluate = _importance(model, task, tokenizer, cfg, max_length, data)
    timing["importance"] = time.perf_counter() - t0
    curve, curve_note = None, None
    if task is not None and cfg.curve:
        t0 = time.perf_counter()
        curve = pruning_curve(model, evaluate, task.primary_metric, scores, cfg.curve_steps, cfg.seed)
        timing["curve"] = time.perf_counter() - t0
        split = next(iter(dev))
        curve_note = (f"dev {task.primary_metric} on {len(dev[split])} {task.display} {split} examples; heads masked "
                      f"with hooks (no surgery), importance computed once before masking, random order seed {cfg.seed}")
    elif task is None:
        curve_note = "no pruning curve: it needs a task (a dev metric): --task, or your task's --train-file/--dev-file"
    else:
        curve_note = "no pruning curve (--no-curve)"

    layer_ids, ids = head_ids(model)
    names = [[f"L{layer_ids[l]}H{h}" for h in row] for l, row in enumerate(ids)]
    flat_names = [n for row in names for n in row]
    coords = mds_layout(stats.js, cfg.seed) if stats.js else []
    result: dict[str, Any] = {
        "kind": "heads",
        "model": str(Path(model_dir).resolve()),
        "task": task.name if task else None,
        "inputs": {"source": source, "n": stats.n_inputs, "max_length": max_length,
                   "mean_tokens": stats.mean_tokens, "js_inputs": stats.n_js_inputs},
        "structure": st.describe(model),
        "heads": {"layers": layer_ids, "ids": ids, "names": names,
                  "original_heads_per_layer": st.config_sizes(model.config).heads},
        "statistics": stats.per_head,
        "uniform_entropy": stats.uniform_entropy,
        "distance_per_layer": [sum(row) / len(row) for row in stats.per_head["distance"]],
        "importance": {"method": method, "criterion": criterion, "scores": scores},
        "specialised": specialised_heads(stats.per_head, names, stats.uniform_entropy),
        "js": {"names": flat_names, "matrix": stats.js, "mds": coords},
        "curve": {"metric": task.primary_metric if task else None, "note": curve_note, "points": curve},
        "config": asdict(cfg),
        "seconds": timing,
        "when": utc_now(),
    }
    with output_dir(out, overwrite) as tmp:
        images = write_plots(result, tmp)
        timing["total"] = time.perf_counter() - started
        result["images"] = images
        write_json_atomic(tmp / "heads.json", result)
        (tmp / "summary.md").write_text(format_summary(result), encoding="utf-8")
    return out


def mds_layout(distances: Sequence[Sequence[float]], seed: int = 0) -> list[list[float]]:
    """2-D coordinates whose Euclidean distances approximate the (H, H) ``distances`` (metric MDS)."""

    d = np.asarray(distances, dtype=float)
    if len(d) < 3:  # nothing to lay out: put the heads on a line
        return [[float(d[0, i]) if len(d) else 0.0, 0.0] for i in range(len(d))]
    d = (d + d.T) / 2  # exact symmetry (float sums)
    np.fill_diagonal(d, 0.0)
    if "metric_mds" in inspect.signature(MDS).parameters:
        # scikit-learn >= 1.8 renamed dissimilarity= to metric= (the old name goes in 1.10)
        mds = MDS(n_components=2, metric="precomputed", init="classical_mds", random_state=seed)
    else:
        mds = MDS(n_components=2, dissimilarity="precomputed", random_state=seed, n_init=4)
    return mds.fit_transform(d).tolist()


# ---------------------------------------------------------------------------- summary


GROUPS = (
    # (key, statistic, heading, sentence after "L2H4: 71% of attention on ")
    ("broad", "entropy", "Broad attention (highest entropy)", None),
    ("next", "next", "Next-token heads", "the next token"),
    ("previous", "previous", "Previous-token heads", "the previous token"),
    ("cls", "cls", "[CLS] heads", "[CLS]"),
    ("sep", "sep", "[SEP] heads", "[SEP]"),
    ("punctuation", "punctuation", "Punctuation heads (periods, commas, ...)", "punctuation"),
)


def specialised_heads(per_head: dict[str, list[list[float]]], names: list[list[str]], uniform_entropy: float,
                      top: int = 3) -> dict[str, list[dict[str, Any]]]:
    """The ``top`` heads of each group in :data:`GROUPS`, highest value first."""
    out = {}
    for key, stat, _, _ in GROUPS:
        values = [(v, names[l][h], l, h) for l, row in enumerate(per_head[stat]) for h, v in enumerate(row)]
        values.sort(key=lambda x: -x[0])
        out[key] = [{"head": n, "layer": l, "index": h, "value": v,
                     **({"fraction_of_uniform": v / uniform_entropy} if stat == "entropy" and uniform_entropy > 0 else {})}
                    for v, n, l, h in values[:top]]
    return out


def _sentence(key: str, entry: dict[str, Any], uniform: float) -> str:
    if key == "broad":
        return (f"{entry['head']}: entropy {entry['value']:.2f} nats, {100 * entry.get('fraction_of_uniform', 0):.0f}% "
                f"of uniform attention's {uniform:.2f}")
    tail = next(g[3] for g in GROUPS if g[0] == key)
    return f"{entry['head']}: {100 * entry['value']:.0f}% of attention on {tail}"


def format_summary(result: dict[str, Any]) -> str:
    """summary.md: the most specialised heads in sentences, importance, the pruning-curve table, the figures."""
    inputs, structure = result["inputs"], result["structure"]
    heads = structure["heads"]
    shape = f"{len(heads)} layers, {sum(heads)} heads (" + (
        f"{heads[0]} per layer)" if len(set(heads)) == 1 else "per layer " + ", ".join(map(str, heads)) + ")")
    lines = [
        f"# Attention heads of {Path(result['model']).name}",
        "",
        f"{inputs['n']} inputs: {inputs['source']}; up to {inputs['max_length']} tokens, "
        f"{inputs['mean_tokens']:.1f} on average; {shape}. Heads are named LxHy with the 0-based "
        f"layer and head ids of the unpruned model. Analysis took {result['seconds'].get('total', 0):.0f} s.",
        "",
        "## Most specialised heads (Clark et al. 2019)",
        "",
    ]
    uniform = result["uniform_entropy"]
    for key, _, heading, _ in GROUPS:
        lines.append(f"**{heading}**")
        lines.append("")
        lines.extend(f"- {_sentence(key, e, uniform)}" for e in result["specialised"][key])
        lines.append("")
    per_layer = ", ".join(f"L{layer}: {d:.2f}" for layer, d in zip(result["heads"]["layers"], result["distance_per_layer"]))
    lines += [f"Mean attention distance per layer (tokens): {per_layer}.", ""]

    names = [n for row in result["heads"]["names"] for n in row]
    scores = [s for row in result["importance"]["scores"] for s in row]
    ranked = sorted(zip(scores, names), reverse=True)
    lines += ["## Importance", "", f"Criterion: {result['importance']['criterion']}.", ""]
    lines.append("Most important: " + ", ".join(f"{n} ({s:.3f})" for s, n in ranked[:3])
                 + "; least important: " + ", ".join(f"{n} ({s:.3f})" for s, n in ranked[::-1][:3]) + ".")
    lines.append("")

    curve = result["curve"]
    lines += ["## Pruning curve (Michel et al. 2019)", ""]
    if curve["points"]:
        metric = curve["metric"]
        lines += [f"{curve['note'][0].upper()}{curve['note'][1:]}.", "",
                  f"| heads masked | fraction | {metric}, by importance | {metric}, random order |",
                  "|---:|---:|---:|---:|"]
        total = sum(heads)
        for p in curve["points"]:
            lines.append(f"| {p['removed']}/{total} | {p['fraction']:.2f} | {p['importance']:.2f} | {p['random']:.2f} |")
    else:
        lines.append(f"{curve['note'][0].upper()}{curve['note'][1:]}.")
    lines += ["", "## Figures", ""]
    lines += [f"![{title}]({name})" for name, title in result["images"].items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- plots


def _grid(per_layer: Sequence[Sequence[float]], ids: Sequence[Sequence[int]], width: int):
    """(layers, width) array with each head at its original id; missing (pruned) heads are NaN."""
    grid = np.full((len(per_layer), width), np.nan)
    for l, (row, hs) in enumerate(zip(per_layer, ids)):
        for v, h in zip(row, hs):
            grid[l, h] = v
    return grid


def _heatmap(ax, grid, layer_ids, title: str, *, vmin=None, vmax=None, cmap="viridis", fmt="{:.2f}"):
    shown = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax)  # NaN cells stay blank
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]), [str(l) for l in layer_ids])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    if grid.size <= 300:  # write the values in the cells while they are readable
        # the colour scale's ends, so text is light on dark cells whatever the panel's range
        lo = np.nanmin(grid) if vmin is None else vmin
        hi = np.nanmax(grid) if vmax is None else vmax
        for (l, h), v in np.ndenumerate(grid):
            if not np.isnan(v):
                light = (v - lo) / (hi - lo + 1e-12) < 0.5
                ax.text(h, l, fmt.format(v), ha="center", va="center", fontsize=6, color="white" if light else "black")
    return shown


def _heatmap_figure(panels, layer_ids, ids, width, path: Path, suptitle: str = "", **kw) -> None:
    plt = _pyplot()
    cols = len(panels)
    fig, axes = plt.subplots(1, cols, figsize=(cols * max(3.5, 0.45 * width + 1.5), max(2.5, 0.4 * len(ids) + 1.5)),
                             squeeze=False)
    for ax, (title, values) in zip(axes[0], panels):
        shown = _heatmap(ax, _grid(values, ids, width), layer_ids, title, **kw)
        fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    save_figure(fig, path)
    plt.close(fig)


IMPORTANCE_TITLES = {
    "gradient": "gate-gradient importance (Michel et al.), normalised per layer",
    "magnitude": "weight-magnitude importance (--text: no labels for the gradient)",
}


def write_plots(result: dict[str, Any], directory: Path) -> dict[str, str]:
    """Every PNG of the analysis into ``directory``; returns {file name: title}."""
    plt = _pyplot()
    stats, layer_ids, ids = result["statistics"], result["heads"]["layers"], result["heads"]["ids"]
    width = max([result["heads"]["original_heads_per_layer"]] + [max(row) + 1 for row in ids])
    images: dict[str, str] = {}

    _heatmap_figure([("head importance", result["importance"]["scores"])], layer_ids, ids, width,
                    directory / "importance.png", suptitle=IMPORTANCE_TITLES[result["importance"]["method"]], cmap="magma")
    images["importance.png"] = "head importance"
    _heatmap_figure([("mean attention entropy (nats)", stats["entropy"])], layer_ids, ids, width,
                    directory / "entropy.png", suptitle=f"uniform attention: {result['uniform_entropy']:.2f} nats")
    images["entropy.png"] = "attention entropy"
    _heatmap_figure([("to [CLS]", stats["cls"]), ("to [SEP]", stats["sep"]), ("to punctuation", stats["punctuation"])],
                    layer_ids, ids, width, directory / "attention_tokens.png", vmin=0.0, vmax=1.0,
                    suptitle="mean fraction of attention on special tokens and punctuation")
    images["attention_tokens.png"] = "attention to CLS, SEP and punctuation"
    _heatmap_figure([("previous token", stats["previous"]), ("same token", stats["same"]), ("next token", stats["next"])],
                    layer_ids, ids, width, directory / "attention_offsets.png", vmin=0.0, vmax=1.0,
                    suptitle="mean fraction of attention on neighbouring tokens")
    images["attention_offsets.png"] = "attention to the previous, same and next token"

    # mean attention distance: per-head points and the layer mean
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for l, row in enumerate(stats["distance"]):
        ax.scatter([l] * len(row), row, s=12, alpha=0.5, color="tab:blue")
    ax.plot(range(len(layer_ids)), result["distance_per_layer"], "o-", color="tab:red", label="layer mean")
    ax.set_xticks(range(len(layer_ids)), [str(l) for l in layer_ids])
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention distance (tokens)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, directory / "distance.png")
    plt.close(fig)
    images["distance.png"] = "mean attention distance per layer"

    coords = result["js"]["mds"]
    if coords:
        fig, ax = plt.subplots(figsize=(5.5, 4.5))
        layer_of = [l for l, row in enumerate(ids) for _ in row]
        cmap = plt.get_cmap("viridis", max(2, len(layer_ids)))
        points = ax.scatter([c[0] for c in coords], [c[1] for c in coords], c=layer_of, cmap=cmap,
                            vmin=-0.5, vmax=len(layer_ids) - 0.5, s=30)
        if len(coords) <= 200:
            for (x, y), name in zip(coords, result["js"]["names"]):
                ax.annotate(name, (x, y), fontsize=5, xytext=(2, 2), textcoords="offset points")
        bar = fig.colorbar(points, ax=ax, ticks=range(len(layer_ids)))
        bar.ax.set_yticklabels([str(l) for l in layer_ids])
        bar.set_label("layer")
        ax.set_title(f"heads embedded by Jensen-Shannon distance (MDS, {result['inputs']['js_inputs']} inputs)", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        save_figure(fig, directory / "js_mds.png")
        plt.close(fig)
        images["js_mds.png"] = "heads embedded by Jensen-Shannon distance (MDS)"

    points = result["curve"]["points"]
    if points:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        xs = [p["fraction"] for p in points]
        ax.plot(xs, [p["importance"] for p in points], "o-", label="by importance (least important first)")
        ax.plot(xs, [p["random"] for p in points], "s--", label="random order")
        ax.set_xlabel("fraction of heads masked")
        ax.set_ylabel(f"dev {result['curve']['metric']}")
        ax.set_title("pruning curve; importance computed once before masking", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save_figure(fig, directory / "pruning_curve.png")
        plt.close(fig)
        images["pruning_curve.png"] = "pruning curve: masking heads by importance vs at random"
    return images



def summarize(out: Path, cfg: HeadsConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress heads`` prints: summary.md up to its importance section."""
    lines = (out / "summary.md").read_text(encoding="utf-8").splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("## Importance")), len(lines))
    return "\n".join(lines[:end]).rstrip(), []
