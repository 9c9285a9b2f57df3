"""``compress prune`` and ``compress prune-embedding``'s options: :class:`PrunePlan` (what to remove), shared by
:class:`PruneConfig` (a task model) and :class:`EmbeddingPruneConfig` (a sentence-embedding model).

Kept apart from :mod:`compress.prune` (torch, transformers) so that a command's flags and its config checks cost no
heavy import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from compress.core.config import flat_keywords, option
from compress.core.data.config import TaskData
from compress.core.data.tasks import get_task, is_kind, task_choices
from compress.core.errors import CompressError
from compress.core.train_config import TrainConfig
from compress.distill.config import EmbeddingDistillConfig


def _recovery_defaults() -> TrainConfig:
    return TrainConfig(epochs=1, lr=2e-5, batch_size=32, warmup_ratio=0.1)


@dataclass(frozen=True)
class PrunePlan:
    """What to remove and how to choose it: shared by task pruning and sentence-embedding pruning."""

    remove_heads: float | None = option(None, "attention heads to remove: a fraction below 1 (0.5) or a whole count (48; "
                                        "1 and 1.0 mean one head, not all of them)")
    head_scope: Literal["global", "layer"] = option("global", "rank heads across all layers, or the same share in each layer")
    head_criterion: Literal["gradient", "magnitude", "entropy", "random"] = option("gradient", "head importance: Michel's gate gradient, weight magnitude, attention entropy, random")
    normalize: bool = option(True, "normalise gradient importance per layer (Michel et al.)")
    iterations: int = option(1, "prune the heads in this many equal steps, re-scoring (and recovering, if set) in between")
    until: float | None = option(None, "instead of --remove-heads: mask heads 10% at a time while the dev metric stays above this fraction of the start (e.g. 0.99)")
    until_step: float = option(0.1, "with --until: fraction of the original heads masked per step")
    remove_layers: str | None = option(None, "layers to remove: top:N, bottom:N, alternate, importance:N, or 0-based ids 1,3,5")
    remove_ffn: float | None = option(None, "FFN neurons to remove: a fraction of them (0.3)")
    ffn_criterion: Literal["taylor", "magnitude"] = option("taylor", "FFN neuron importance: activation x gradient, or weight magnitude")
    ffn_scope: Literal["uniform", "global"] = option("uniform", "uniform: the same width in every layer (loads with stock from_pretrained); global: rank all neurons")

    def validate_plan(self) -> None:
        if self.remove_heads is None and self.until is None and self.remove_layers is None and self.remove_ffn is None:
            raise CompressError("nothing to prune; pass --remove-heads, --until, --remove-layers and/or --remove-ffn")
        if self.remove_heads is not None and self.until is not None:
            raise CompressError("pass either --remove-heads or --until, not both")
        if self.remove_heads is not None and (self.remove_heads <= 0 or (self.remove_heads >= 1 and self.remove_heads != int(self.remove_heads))):
            raise CompressError(f"--remove-heads must be a fraction in (0, 1) or a whole number of heads, got {self.remove_heads}")
        if self.remove_ffn is not None and not 0 < self.remove_ffn < 1:
            raise CompressError(f"--remove-ffn must be a fraction in (0, 1), got {self.remove_ffn}")
        if self.until is not None and not 0 < self.until <= 1:
            raise CompressError(f"--until must be a fraction of the starting metric in (0, 1], got {self.until}")
        if self.iterations < 1:
            raise CompressError(f"--iterations must be at least 1, got {self.iterations}")
        if not 0 < self.until_step < 1:
            raise CompressError(f"--until-step must be in (0, 1), got {self.until_step}")


@flat_keywords
@dataclass(frozen=True)
class PruneConfig(PrunePlan):
    task: str = option("", "task the model is fine-tuned on (scores use its loss, checks use its dev metric; default: the "
                       "model's own task)", choices=task_choices)
    recovery: Literal["none", "finetune", "distill"] = option("none", "after pruning: fine-tune on the task, or distil from the unpruned model")
    recovery_teacher: str | None = option(
        None, "with --recovery distill: distil from this fine-tuned model DIR instead of the unpruned one (for a pruned "
              "student: the teacher it was distilled from)", metavar="DIR")
    importance_examples: int = option(512, "training examples used to score units")
    data: TaskData = field(default_factory=TaskData)
    train: TrainConfig = field(default_factory=_recovery_defaults)

    def validate(self) -> None:
        if self.task and not is_kind(self.task):
            get_task(self.task)
        self.validate_plan()
        if self.recovery_teacher and self.recovery != "distill":
            raise CompressError(f"--recovery-teacher is the model a distillation recovery learns from; "
                                f"add --recovery distill (got --recovery {self.recovery})")


def _embedding_recovery_defaults() -> TrainConfig:
    return TrainConfig(epochs=1, lr=1e-4, batch_size=64, warmup_ratio=0.05, log_every=20)


@flat_keywords
@dataclass(frozen=True)
class EmbeddingPruneConfig(PrunePlan):
    corpus: tuple[str, ...] = option(
        (), "unlabelled text to score units (and recover) on: text files or folders of *.txt, datasets save_to_disk "
        "folders, or hf:NAME[:CONFIG]", metavar="PATH[,...]")
    sentences_from: tuple[str, ...] = option(
        (), "GLUE tasks whose training sentences are added as unlabelled text (labels unused)", metavar="TASK[,...]")
    data_dir: str | None = option(None, "GLUE root or task folder for --sentences-from and --eval-tasks (default: the hub)", metavar="DIR")
    max_sentences: int | None = option(None, "use a seeded random sample of N sentences (say so when reporting)")
    min_words: int = option(3, "drop sentences with fewer words (headings, list markers)")
    heldout_sentences: int = option(500, "sentences held out (at most a tenth): the pruned model's mean cosine to the "
                                         "unpruned model's embeddings of them is the check without --eval-tasks")
    importance_sentences: int = option(512, "sentences used to score units")
    eval_tasks: tuple[str, ...] = option(
        (), "pair tasks scored before and after (the first one is the check --until watches): stsb (cosine Spearman), "
        "mrpc, qqp, rte ... (retrieval MRR)", metavar="TASK[,...]")
    max_length: int = option(128, "tokens per sentence when scoring and recovering (the folder keeps its max_seq_length)")
    recovery: Literal["none", "distill"] = option("none", "after pruning: distil the unpruned model's embeddings back into it (MSE + cosine)")
    train: TrainConfig = field(default_factory=_embedding_recovery_defaults)

    def validate(self) -> None:
        self.validate_plan()
        self.distill_config("teacher-layers").validate()  # the sentence sources and eval tasks, checked as distillation checks them
        if self.importance_sentences < 1:
            raise CompressError(f"--importance-sentences must be at least 1, got {self.importance_sentences}")

    def distill_config(self, init: str) -> EmbeddingDistillConfig:
        """The embedding distillation that recovers a pruned model (``init``) from the unpruned one."""
        return EmbeddingDistillConfig(
            corpus=self.corpus, sentences_from=self.sentences_from, data_dir=self.data_dir, max_sentences=self.max_sentences,
            min_words=self.min_words, heldout_sentences=self.heldout_sentences, init=init, max_length=self.max_length,
            eval_tasks=self.eval_tasks, train=self.train,
        )
