"""The int8 stage's inputs: calibration batches (a task's rows, random ids, or a sentence folder's text) and held-out check sentences.

Every source ends as a :class:`Calibration`: fixed-length int64 batches of ``CALIBRATION_BATCH``
rows (each ``(batch, length)``, input_ids / attention_mask / token_type_ids) and a ``source``
record that compression.json keeps. The first ``CHECK_EXAMPLES`` rows are also the output
check's inputs (``compress.quantize.checks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from compress.core.data.features import check_max_length, encode_examples
from compress.core.data.sources import load_split
from compress.core.data.tasks import Task
from compress.core.formats.runners import INPUTS
from compress.core.formats.sentence import SentenceSpec, prepare_texts, read_spec
from compress.distill.embedding import embedding_scorers, embedding_sentences
from compress.quantize.config import QuantizeConfig

CALIBRATION_BATCH = 8  # sequences per calibration forward pass
CHECK_EXAMPLES = 16  # examples run through fp32 and int8 side by side
RANDOM_CHECK_LENGTH = 32  # tokens per random check sequence when no task is given


@dataclass
class Calibration:
    """Fixed-length int64 input batches (each (batch, length)) and where they came from."""

    batches: list[dict[str, Any]]
    source: dict[str, Any]

    def tensors(self, names: tuple[str, ...] = INPUTS) -> Iterator[tuple]:
        """Each batch as positional torch tensors ``names`` (input_ids, attention_mask[, token_type_ids])."""

        for batch in self.batches:
            yield tuple(torch.from_numpy(batch[name]) for name in names)

    def example(self, names: tuple[str, ...] = INPUTS) -> tuple:
        """The first batch as export's example inputs, at least 2 rows (a batch of 1 would be specialised)."""
        inputs = next(self.tensors(names))
        return tuple(torch.cat([t, t]) if t.shape[0] < 2 else t for t in inputs)

    def rows(self, names: tuple[str, ...] = INPUTS) -> list[dict[str, np.ndarray]]:
        """Every example alone at its own length, each input (1, length): padding positions stay out of the ranges
        (a task's rows are padded to --max-length, most of each row for short texts)."""
        rows = []
        for batch in self.batches:
            for row, mask in enumerate(batch["attention_mask"]):
                length = int(mask.sum())
                end = length if length and mask[:length].all() else len(mask)  # padded on the right, else kept whole
                rows.append({name: batch[name][row : row + 1, :end] for name in names})
        return rows

    def check_batches(self) -> list[dict[str, Any]]:
        """The first CHECK_EXAMPLES rows, in calibration-sized batches."""
        batches, left = [], CHECK_EXAMPLES
        for batch in self.batches:
            if left <= 0:
                break
            batches.append({k: v[:left] for k, v in batch.items()})
            left -= len(batch["input_ids"])
        return batches


def task_calibration(task: Task, tokenizer, cfg: QuantizeConfig, max_length: int, n: int) -> Calibration:
    """``n`` seeded random training examples of ``task``, tokenised and padded to ``max_length``."""
    train_src, _ = cfg.data.sources()
    ds = load_split(task, "train", train_src)
    n = min(n, len(ds))
    ds = ds.shuffle(seed=cfg.seed).select(range(n))
    enc = encode_examples(task, tokenizer, ds, max_length, padding="max_length", return_tensors="np")
    batches = _batches(enc, n)
    source = {"task": task.name, "split": "train", "examples": n, "max_length": max_length, "seed": cfg.seed,
              "data": cfg.data.describe()}
    return Calibration(batches, source)


def random_calibration(tokenizer, max_positions: int, seed: int) -> Calibration:
    """Random token sequences ([CLS] ... [SEP], varied lengths) for the output check when there is no task."""
    rng = np.random.default_rng(seed)
    length = min(RANDOM_CHECK_LENGTH, max_positions)
    special = set(tokenizer.all_special_ids)
    vocab = np.array([i for i in range(len(tokenizer)) if i not in special])
    ids = rng.choice(vocab, size=(CHECK_EXAMPLES, length))  # (examples, length)
    mask = np.ones_like(ids)
    for row, used in enumerate(rng.integers(length // 2, length + 1, size=CHECK_EXAMPLES)):
        ids[row, 0], ids[row, used - 1] = tokenizer.cls_token_id, tokenizer.sep_token_id
        ids[row, used:], mask[row, used:] = tokenizer.pad_token_id, 0
    enc = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return Calibration(_batches(enc, CHECK_EXAMPLES), {"task": None, "split": None, "examples": CHECK_EXAMPLES, "inputs": "random token ids"})


@dataclass
class SentenceCheck:
    """A sentence-embedding folder's held-out check: sentences never calibrated on, and how the folder embeds them."""

    sentences: list[str]
    spec: SentenceSpec  # pooling, normalisation, lower-casing
    max_length: int  # tokens per sentence, as SentenceTransformer truncates them
    scorers: dict[str, tuple[Any, Any, Any]]  # --eval-tasks: task name -> (task, dev split, score(model))


def sentence_calibration(model_dir: Path, tokenizer, cfg: QuantizeConfig, max_positions: int) -> tuple[Calibration, SentenceCheck]:
    """A sentence-embedding folder's unlabelled sentences: a seeded calibration sample and disjoint check sentences.

    The sentences are gathered as embedding distillation gathers them (distinct, of at least
    ``min_words`` words, in the order ``cfg.seed`` shuffles them): the first ``check_sentences``
    (at most half) are held out for the cosine check, the next ``calibration_examples`` (the
    output check's few when nothing is calibrated) calibrate, tokenised as SentenceTransformer
    tokenises them, truncated at the folder's length and padded to the sample's longest.
    """
    spec = read_spec(model_dir)
    max_length = cfg.data.max_length or spec.max_length(tokenizer, max_positions)
    check_max_length(max_length, max_positions)
    sentence_cfg = cfg.sentence_config()
    sentences, sources = embedding_sentences(sentence_cfg)  # at least 2, or a one-line error
    n_check = min(cfg.check_sentences, len(sentences) // 2)  # a short text keeps at least half for calibration
    wanted = cfg.calibration_examples if cfg.scheme == "static" else CHECK_EXAMPLES
    held, chosen = sentences[:n_check], sentences[n_check : n_check + wanted]
    enc = tokenizer(prepare_texts(chosen, spec), padding="longest", truncation="longest_first", max_length=max_length,
                    return_tensors="np")  # (examples, the longest one's tokens)
    source = {
        "task": None, "split": None, "inputs": "unlabelled sentences", "examples": len(chosen), "sources": sources,
        "corpus": list(cfg.corpus), "sentences_from": list(cfg.sentences_from),
        "data": cfg.data.describe() if cfg.sentences_from else None, "min_words": sentence_cfg.min_words,
        "seed": cfg.seed, "max_length": max_length, "padded_length": int(enc["input_ids"].shape[1]),
        "check_sentences": n_check,
    }
    check = SentenceCheck(held, spec, max_length, embedding_scorers(sentence_cfg, tokenizer, spec))
    return Calibration(_batches(enc, len(chosen)), source), check


def _batches(enc, n: int) -> list[dict[str, Any]]:
    """Cut (n, length) arrays into int64 batches of CALIBRATION_BATCH rows."""

    arrays = {name: np.asarray(enc[name], dtype=np.int64) if name in enc else np.zeros_like(enc["input_ids"], dtype=np.int64) for name in INPUTS}
    return [{k: v[i : i + CALIBRATION_BATCH] for k, v in arrays.items()} for i in range(0, n, CALIBRATION_BATCH)]

