"""Pretrain a BERT from scratch with masked LM + next-sentence prediction (Devlin et al. 2019).

``pretrain(out, cfg)``: read the corpus (documents separated by blank lines), train a
WordPiece vocabulary (or reuse one), build NSP sentence pairs for each phase, and train
a ``BertForPreTraining`` with AdamW (lr 1e-4, betas 0.9/0.999, weight decay 0.01),
linear warm-up then linear decay, dropout 0.1 and GELU: phase 1 at sequence length 128
for 90% of the steps, phase 2 at 512 for the rest. The loss is mean MLM cross-entropy
over the selected tokens plus mean NSP cross-entropy. The output is a model directory
(weights, tokenizer, compression.json) whose metrics.json holds the training curves,
the held-out MLM/NSP accuracy and the measured masking statistics, with a PNG of the
curves beside it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import BertForPreTraining, BertTokenizerFast

from compress.core.formats.artifacts import save_model_dir
from compress.core.formats.records import compression_record, read_metrics, utc_now
from compress.core.preflight import check_output
from compress.core.model.structure import PretrainingForward, count_parameters, make_config
from compress.core.checkpoints import prepare_work_dir, work_dir_for
from compress.core.processes import is_main_process, main_process_first
from compress.core.train import Phase, train_phases
from compress.teacher.config import PretrainConfig
from compress.eval.plots import plot_curves
from compress.teacher.corpus import (
    PretrainCollator,
    _text_files,
    build_instances,
    is_dataset_source,
    masking_stats,
    read_documents,
    tokenize_documents,
)
from compress.teacher.create import load_any_tokenizer
from compress.teacher.tokenizer import train_wordpiece

CURVES_PNG = "pretraining_curves.png"


def phase_steps(total: int, phase1_fraction: float) -> tuple[int, int]:
    """Steps of phase 1 and phase 2 (phase 1 gets the rounding)."""
    first = min(total, max(1, round(total * phase1_fraction)))
    return first, total - first


def _tokenizer(cfg: PretrainConfig, work: Path, documents: list[list[str]]):
    """Reuse the given tokenizer, the one a previous (interrupted) run trained, or train one."""

    saved = work / "tokenizer"
    if cfg.tokenizer:
        return load_any_tokenizer(cfg.tokenizer)
    if (saved / "tokenizer.json").is_file():
        # WordPiece training breaks frequency ties in hash order: reuse, never retrain, on resume.
        return BertTokenizerFast.from_pretrained(saved, local_files_only=True)

    if any(is_dataset_source(c) for c in cfg.corpus):  # WordPiece trains on files: write the documents out once
        files = [work / "corpus.txt"]
        files[0].write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    else:
        files = _text_files(list(cfg.corpus))
    tokenizer = train_wordpiece(files, cfg.vocab_size, lowercase=cfg.lowercase)
    tokenizer.save_pretrained(saved)
    return tokenizer


def build_model(cfg: PretrainConfig, vocab_size: int, seed: int):
    shape = cfg.sizes.apply(cfg.shape)
    torch.manual_seed(seed)
    config = make_config(shape, vocab_size=vocab_size, max_positions=cfg.max_positions)
    config.architectures = ["BertForPreTraining"]
    return BertForPreTraining(config), shape


def pretraining_loss(model, batch) -> tuple[Any, dict[str, Any]]:
    """Mean MLM cross-entropy over selected tokens + mean NSP cross-entropy, and accuracies.

    The MLM head runs on the selected positions only: (n_selected, vocab) logits instead of
    (batch, seq, vocab), which would not fit in memory for a 30k vocabulary.
    """

    # ``model``: the training wrapper (maybe inside DistributedDataParallel), or a bare BertForPreTraining
    forward = model if isinstance(getattr(model, "module", model), PretrainingForward) else PretrainingForward(model)
    labels = batch["labels"]  # (batch, seq), -100 where nothing is predicted
    mlm_logits, nsp_logits = forward(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], labels)
    mlm_targets = labels[labels != -100]  # (n_selected,), in the order of mlm_logits' rows
    mlm_loss = F.cross_entropy(mlm_logits.float(), mlm_targets)
    nsp_loss = F.cross_entropy(nsp_logits.float(), batch["next_sentence_label"])
    with torch.no_grad():
        logs = {
            "mlm_loss": mlm_loss.detach(),
            "nsp_loss": nsp_loss.detach(),
            "mlm_accuracy": (mlm_logits.argmax(-1) == mlm_targets).float().mean() * 100,
            "nsp_accuracy": (nsp_logits.argmax(-1) == batch["next_sentence_label"]).float().mean() * 100,
        }
    return mlm_loss + nsp_loss, logs


def heldout_evaluator(instances, collator, batch_size: int = 64):
    """``evaluate(model) -> {mlm_accuracy, nsp_accuracy, mlm_loss}`` on held-out pairs with fixed masks."""
    batches = [collator(instances[i : i + batch_size], step=10**9 + i) for i in range(0, len(instances), batch_size)]

    def evaluate(model) -> dict[str, float]:
        device = next(model.parameters()).device
        sums = {"mlm_correct": 0.0, "mlm_n": 0.0, "nsp_correct": 0.0, "nsp_n": 0.0, "mlm_loss": 0.0}
        with torch.inference_mode():
            for batch in batches:
                batch = {k: v.to(device) for k, v in batch.items()}
                _, logs = pretraining_loss(model, batch)
                n_sel = float((batch["labels"] != -100).sum())
                sums["mlm_correct"] += float(logs["mlm_accuracy"]) * n_sel / 100
                sums["mlm_n"] += n_sel
                sums["mlm_loss"] += float(logs["mlm_loss"]) * n_sel
                n = float(batch["input_ids"].shape[0])
                sums["nsp_correct"] += float(logs["nsp_accuracy"]) * n / 100
                sums["nsp_n"] += n
        return {
            "mlm_accuracy": 100 * sums["mlm_correct"] / max(1.0, sums["mlm_n"]),
            "nsp_accuracy": 100 * sums["nsp_correct"] / max(1.0, sums["nsp_n"]),
            "mlm_loss": sums["mlm_loss"] / max(1.0, sums["mlm_n"]),
        }

    return evaluate


def pretrain(out: str | Path, cfg: PretrainConfig, *, overwrite: bool = False) -> Path:
    """Pretrain a BERT on ``cfg.corpus`` and write it (with its tokenizer) to ``out``."""
    out = Path(out)
    check_output(out, overwrite, inputs=cfg, resume=cfg.resume)
    documents = read_documents(list(cfg.corpus))  # bad input fails here, before anything is written
    work = prepare_work_dir(work_dir_for(out), cfg.resume)
    with main_process_first():  # rank 0 trains (and saves) the vocabulary, the others load it
        tokenizer = _tokenizer(cfg, work, documents)
    docs_ids = tokenize_documents(documents, tokenizer)
    n_tokens = sum(len(s) for d in docs_ids for s in d)
    seed = cfg.train.seed
    total = cfg.train.max_steps or 1000
    steps1, steps2 = phase_steps(total, cfg.phase1_fraction)
    collator = PretrainCollator(tokenizer, mlm_probability=cfg.mlm_probability, whole_word=cfg.whole_word, seed=seed)

    phases, heldout, stats = [], [], {}
    for index, (length, steps, batch) in enumerate(
        ((cfg.phase1_length, steps1, None), (cfg.phase2_length, steps2, cfg.phase2_batch_size))
    ):
        if steps == 0:
            continue
        instances = build_instances(
            docs_ids, length, seed + index, short_seq_prob=cfg.short_seq_prob,
            nsp_probability=cfg.nsp_probability, dupe_factor=cfg.dupe_factor,
        )
        n_held = int(len(instances) * cfg.heldout_fraction)
        if index == 0:
            heldout = instances[:n_held]
            # The data pipeline's own statistics, over the phase-1 pairs actually trained on.
            stats = masking_stats(tokenizer, instances[n_held:], mlm_probability=cfg.mlm_probability,
                                  whole_word=cfg.whole_word, seed=seed)
            stats["not_next_fraction"] = sum(x.is_random_next for x in instances) / len(instances)
            stats["pairs"] = len(instances)
        train_set = instances[n_held:]
        lengths = [len(x.tokens_a) + len(x.tokens_b) + 3 for x in train_set]
        phases.append(Phase(train_set, collator, batch_size=batch, steps=steps, lengths=lengths, name=f"seq{length}"))

    model, shape = build_model(cfg, len(tokenizer), seed)
    evaluate = heldout_evaluator(heldout, collator) if heldout else None
    result = train_phases(
        PretrainingForward(model), phases, cfg.train, loss_fn=pretraining_loss, work_dir=work, evaluate=evaluate,
        resume=cfg.resume, run_key=[len(documents), n_tokens, len(tokenizer), shape.label], desc="pretraining",
    )
    if not is_main_process():
        return out
    training = {
        "kind": "training", "stage": "pretrain", "steps": result.steps, "seconds": round(result.seconds, 1),
        "processes": result.processes,
        "phases": [{"name": p.name, "steps": p.steps, "pairs": len(p.dataset)} for p in phases],
        "corpus": {"documents": len(documents), "tokens": n_tokens, "vocab_size": len(tokenizer)},
        "masking": stats, "history": result.history, "when": utc_now(),
    }
    final = next((h["eval"] for h in reversed(result.history) if "eval" in h), None)
    metrics = [training]
    if final:
        metrics.append({"kind": "eval", "task": "pretraining", "split": "heldout", "n": len(heldout), "metrics": final})
    record = compression_record(
        stage="pretrain", method="mlm+nsp", config=cfg, seed=seed,
        extra={"shape": shape.__dict__, "params": count_parameters(model), "corpus": list(cfg.corpus)},
    )
    curves = work / CURVES_PNG
    plot_curves(
        result.history,
        [("loss", ("mlm_loss", "nsp_loss")), ("accuracy (%)", ("mlm_accuracy", "nsp_accuracy"))],
        curves, title=f"pretraining {shape.label} ({result.steps} steps)",
    )
    save_model_dir(model, out, tokenizer=tokenizer, record=record, overwrite=overwrite,
                   metrics=metrics, files={CURVES_PNG: curves})
    shutil.rmtree(work, ignore_errors=True)
    return out


def summarize(out: Path, cfg: PretrainConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress teacher pretrain`` prints: the held-out MLM and NSP accuracy."""
    heldout = [r for r in read_metrics(out) if r.get("task") == "pretraining"]
    if not heldout:
        return "", []
    m = heldout[-1]["metrics"]
    return f"held-out MLM accuracy {m['mlm_accuracy']:.2f}%, NSP accuracy {m['nsp_accuracy']:.2f}%", []
