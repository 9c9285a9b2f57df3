"""The teacher stage's options: :class:`PretrainConfig` and :class:`FinetuneConfig`.

Kept apart from :mod:`compress.teacher.pretrain` and :mod:`compress.teacher.finetune` (torch, transformers) so that
``compress teacher ... --help`` and a refused option cost no heavy import.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compress.core.config import flat_keywords, option
from compress.core.data.config import TaskData
from compress.core.data.tasks import task_choices
from compress.core.errors import CompressError
from compress.core.model.shapes import TEACHER_SHAPES, ShapeSizes
from compress.core.train_config import TrainConfig


def _pretrain_defaults() -> TrainConfig:
    # The paper's optimiser; its 1M steps x 256 sequences are far beyond a CPU, so the
    # step count is the user's budget (warm-up: the paper's 10k of 1M = 1%).
    return TrainConfig(lr=1e-4, batch_size=256, max_steps=1000, warmup_ratio=0.01, adam_eps=1e-6,
                       weight_decay=0.01, log_every=10, save_every=200)


@flat_keywords
@dataclass(frozen=True)
class PretrainConfig:
    corpus: tuple[str, ...] = option(
        (), "text files or folders of *.txt (documents separated by blank lines), datasets save_to_disk folders, "
        "or hf:NAME[:CONFIG] (a hub dataset's train split; each row of its text column a document)", metavar="PATH[,...]")
    tokenizer: str | None = option(None, "reuse this tokenizer (model dir, tokenizer folder or vocab.txt) instead of training one", metavar="PATH")
    vocab_size: int = option(30522, "WordPiece vocabulary size when training one")
    lowercase: bool = option(True, "lower-case and strip accents (uncased BERT)")
    shape: str = option("4L-256", "model shape: a preset or LAYERSL-HIDDEN[-FFN]", choices=TEACHER_SHAPES.names, other="LAYERSL-HIDDEN[-FFN]")
    sizes: ShapeSizes = field(default_factory=ShapeSizes)
    max_positions: int = option(512, "position embeddings (at least the phase-2 length)")
    phase1_length: int = option(128, "sequence length of phase 1")
    phase2_length: int = option(512, "sequence length of phase 2")
    phase1_fraction: float = option(0.9, "fraction of steps in phase 1 (1.0: no phase 2)")
    phase2_batch_size: int | None = option(None, "global batch of phase 2 (default: --batch-size)")
    mlm_probability: float = option(0.15, "fraction of tokens selected for MLM (80% [MASK], 10% random, 10% kept)")
    whole_word: bool = option(False, "whole-word masking: all WordPieces of a selected word together")
    short_seq_prob: float = option(0.1, "probability of a shorter target length for a pair (as in BERT)")
    nsp_probability: float = option(0.5, "probability that segment B is a random NotNext segment")
    dupe_factor: int = option(1, "times the corpus is turned into sentence pairs (different pairs each time)")
    heldout_fraction: float = option(0.01, "pairs held out to measure MLM and NSP accuracy during training")
    resume: bool = option(False, "continue an interrupted run from its last checkpoint into the same --out")
    train: TrainConfig = field(default_factory=_pretrain_defaults)

    def validate(self) -> None:
        if not self.corpus:
            raise CompressError("no corpus given; pass --corpus FILE_OR_DIR[,...]")
        if not 0 < self.phase1_fraction <= 1:
            raise CompressError(f"--phase1-fraction must be in (0, 1], got {self.phase1_fraction}")
        if not 0 < self.mlm_probability < 1:
            raise CompressError(f"--mlm-probability must be in (0, 1), got {self.mlm_probability}")
        if self.phase1_fraction < 1 and self.phase2_length > self.max_positions:
            raise CompressError(f"--phase2-length {self.phase2_length} exceeds --max-positions {self.max_positions}")
        if self.phase1_length > self.max_positions:
            raise CompressError(f"--phase1-length {self.phase1_length} exceeds --max-positions {self.max_positions}")
        if not 0 <= self.heldout_fraction < 0.5:
            raise CompressError(f"--heldout-fraction must be in [0, 0.5), got {self.heldout_fraction}")
        if self.vocab_size < 100:
            raise CompressError(f"--vocab-size {self.vocab_size} is too small; use at least 100")


@flat_keywords
@dataclass(frozen=True)
class FinetuneConfig:
    task: str = option("", "task to fine-tune on: a benchmark name, or a kind of your own data with --train-file "
                       "(default: the model's own task)", choices=task_choices)
    resume: bool = option(False, "continue from the last checkpoint of an interrupted run into the same --out")
    data: TaskData = field(default_factory=TaskData)
    train: TrainConfig = field(default_factory=TrainConfig)
