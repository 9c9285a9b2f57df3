"""General (task-agnostic) distillation of an encoder on raw text: DistilBERT's first stage, MiniLM.

``distill_general(teacher, out, cfg)`` builds the student as task distillation does
(:func:`compress.distill.task.build_student`) and trains it on a text corpus: MiniLM's
last-layer attention and value relations (``minilm``, any BERT encoder can teach), or
DistilBERT's masked-LM terms (``mlm`` + ``kd`` + ``cosine``) when teacher and student have
MLM heads. Its output is the ``--init`` of a task distillation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from compress.core.formats.folder import ModelFolder
from compress.core.formats.records import utc_now
from compress.core.errors import CompressError
from compress.core.model.heads import HEADS
from compress.core.checkpoints import prepare_work_dir, work_dir_for
from compress.core.processes import is_main_process
from compress.core.train import Phase
from compress.distill.steps import (
    Distiller,
    build_student,
    check_out,
    device_for,
    distill_record,
    make_loss_fn,
    make_projections,
    open_teacher,
    train_keeping_best,
    write_student,
)
from compress.distill.config import GeneralDistillConfig
from compress.distill.terms import ENCODER, MLM, needs_of
from compress.teacher.corpus import PretrainCollator, build_instances, read_documents, tokenize_documents
from compress.teacher.presets import open_model


def distill_general(teacher: str | Path, out: str | Path, cfg: GeneralDistillConfig, *, overwrite: bool = False) -> Path:
    """Task-agnostic distillation of an encoder on raw text (DistilBERT's first stage, MiniLM).

    MiniLM-style (``minilm``: last-layer attention and value relations) needs no MLM
    head, so any BERT encoder can teach, and widths may differ. DistilBERT-style
    (``mlm`` + ``kd`` on masked-LM logits + ``cosine``) needs teacher and student MLM
    heads. The output is an encoder directory to start task distillation from
    (``compress distill --init DIR``).
    """
    out = check_out(out, cfg, overwrite, teacher)
    folder = open_model(teacher)
    uses_mlm = bool({"kd", "mlm"} & set(cfg.losses))
    _check_mlm_head(folder, uses_mlm)
    terms = tuple("hard" if t == "mlm" else t for t in cfg.losses)  # mlm is the "hard" term of an MLM batch
    teach = open_teacher(folder, "masked-lm" if uses_mlm else "base", needs_of(terms))
    student = build_student(teach, cfg, needs_of(terms), cfg.loss.layer_map)
    heldout, train_set = _read_corpus(cfg, teach.tokenizer)
    collate_step = _corpus_collator(teach.tokenizer, cfg, uses_mlm)
    device = device_for(teach, cfg.train.device)
    loss_fn = make_loss_fn(MLM if uses_mlm else ENCODER, terms, cfg.loss, teach.model, None, student.pairs)
    wrapper = Distiller(student.model, make_projections(student.model, teach.model, terms))
    held_batches = [collate_step(heldout[i : i + 64], 10**9 + i) for i in range(0, len(heldout), 64)]
    work = prepare_work_dir(work_dir_for(out), cfg.resume)
    result = train_keeping_best(
        wrapper, Phase(train_set, collate_step, lengths=[len(x.tokens_a) + len(x.tokens_b) + 3 for x in train_set], name="corpus"),
        cfg.train, loss_fn=loss_fn, work_dir=work, resume=cfg.resume, desc="general distillation",
        evaluate=_heldout_evaluator(loss_fn, held_batches, device) if held_batches else None,
        select="neg_heldout_loss" if held_batches else None,
        run_key=[teach.hash, len(train_set), student.shape.label, list(cfg.losses)],
    )
    if not is_main_process():
        return out
    training = {
        "kind": "training", "stage": "distill-general", "steps": result.steps, "seconds": round(result.seconds, 1),
        "processes": result.processes,
        "sequences": len(train_set), "history": result.history, "best": result.best, "when": utc_now(),
    }
    return write_student(student, out, teach, distill_record("distill-general", cfg, teach, student), [training],
                          resume=cfg.resume, overwrite=overwrite, work=work)


def _check_mlm_head(folder: ModelFolder, uses_mlm: bool) -> None:
    """The kd/mlm terms read masked-LM logits: refuse a teacher without an MLM head."""
    if uses_mlm and not HEADS[folder.head].masked_lm:
        raise CompressError(
            f"the kd/mlm terms need a teacher with a masked-LM head and {folder.path} has none; "
            "use --losses minilm (or hidden/attention/cosine)"
        )


def _read_corpus(cfg: GeneralDistillConfig, tokenizer) -> tuple[list, list]:
    """(held-out, training) sequences of contiguous corpus text in [CLS] A [SEP] B [SEP] form."""
    docs = tokenize_documents(read_documents(list(cfg.corpus)), tokenizer)
    instances = build_instances(docs, cfg.max_length, cfg.train.seed, nsp_probability=0.0)  # NSP is not distilled
    n_held = int(len(instances) * cfg.heldout_fraction)
    return instances[:n_held], instances[n_held:]


def _corpus_collator(tokenizer, cfg: GeneralDistillConfig, uses_mlm: bool):
    """``collate(items, step)`` of corpus sequences: masked for the kd/mlm terms, clean text otherwise."""
    masker = PretrainCollator(tokenizer, mlm_probability=cfg.mlm_probability, seed=cfg.train.seed)

    def collate_step(items, step):
        batch = masker(items, step)
        batch.pop("next_sentence_label")
        if not uses_mlm:  # MiniLM-style terms read clean text: undo the masking
            selected = batch["labels"] != -100
            batch["input_ids"] = torch.where(selected, batch["labels"], batch["input_ids"])
            batch.pop("labels")
        return batch

    return collate_step


def _heldout_evaluator(loss_fn, batches: list[dict], device):
    """``evaluate(model)``: the distillation loss on held-out batches (and its negation, to select by)."""
    def evaluate(model) -> dict[str, float]:
        total, n = 0.0, 0
        with torch.inference_mode():
            for batch in batches:
                batch = {k: v.to(device) for k, v in batch.items()}  # a copy: loss_fn may pop from it
                loss, _ = loss_fn(model, batch)
                total, n = total + float(loss) * len(batch["input_ids"]), n + len(batch["input_ids"])
        return {"heldout_loss": total / max(1, n), "neg_heldout_loss": -total / max(1, n)}

    return evaluate
