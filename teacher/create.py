"""Create a randomly initialised BERT of a given shape as a model directory.

The starting point of pretraining, and the "BERT-base shape" speed reference that
latency reports compare against.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from transformers import BertTokenizerFast

from compress.core.formats.artifacts import load_tokenizer, save_model_dir
from compress.core.formats.folder import check_tokenizer
from compress.core.formats.records import compression_record
from compress.core.preflight import check_output
from compress.core.compat import wordpiece_tokenizer
from compress.core.errors import CompressError
from compress.core.model.families import get_family
from compress.core.model.heads import HEADS
from compress.core.model.shapes import Shape
from compress.core.model.structure import make_config
from compress.core.data.tasks import get_task, is_kind


def load_any_tokenizer(source: str | Path):
    """A fast tokenizer from a model directory, a tokenizer folder, or a ``vocab.txt`` file."""

    source = Path(source)
    if source.is_file():
        if source.suffix == ".json":
            return check_tokenizer(BertTokenizerFast(tokenizer_file=str(source)), str(source))
        return check_tokenizer(wordpiece_tokenizer(source), str(source))
    if source.is_dir() and (source / "config.json").is_file():
        return load_tokenizer(source)
    if source.is_dir() and ((source / "tokenizer.json").is_file() or (source / "vocab.txt").is_file()):
        return check_tokenizer(BertTokenizerFast.from_pretrained(source, local_files_only=True), str(source))
    raise CompressError(f"no tokenizer at {source}: pass a model directory, a tokenizer folder or a vocab.txt file")


def create_model(
    shape: Shape,
    out: str | Path,
    *,
    tokenizer: str | Path,
    task: str | None = None,
    head: str | None = None,
    seed: int = 0,
    max_positions: int = 512,
    overwrite: bool = False,
) -> Path:
    """Write a random-weight model of ``shape`` (with ``task``'s head and labels) to ``out``."""

    check_output(out, overwrite, inputs=tokenizer)
    if max_positions < 8:
        raise CompressError(f"--max-positions {max_positions} is too small; a model needs at least 8 positions (BERT: 512)")
    tok = load_any_tokenizer(tokenizer)
    extra = {}
    if task and is_kind(task):  # a user's task has no labels until a training file names them
        raise CompressError(f"--task {task} is a kind of your own task, whose labels come from its training file; create the "
                            "model without --task, then: compress teacher finetune --model DIR --task KIND --train-file ...")
    if task:
        t = get_task(task)
        head = head or t.behaviour.head
        if t.behaviour.problem_type is not None:  # a classifier head, sized and named after the task
            extra = {"num_labels": t.num_labels, "problem_type": t.behaviour.problem_type}
            if t.id2label:
                extra.update(id2label=t.id2label, label2id={name: i for i, name in t.id2label.items()})
    head = head or "base"
    if head not in HEADS:
        raise CompressError(f"unknown head {head!r}; valid: {', '.join(HEADS)}")
    arch = get_family("bert").head_class(head)  # a new teacher is a BERT (other families are loaded, not created)
    torch.manual_seed(seed)
    config = make_config(shape, vocab_size=len(tok), max_positions=max_positions, **extra)
    config.architectures = [arch]
    model = getattr(transformers, arch)(config)
    record = compression_record(
        stage="create",
        method="random-init",
        config={"shape": shape.__dict__, "task": task, "head": head, "seed": seed, "max_positions": max_positions},
        seed=seed,
    )
    return save_model_dir(model, out, tokenizer=tok, record=record, overwrite=overwrite)
