"""Distillation's options: :class:`DistillConfig`, :class:`GeneralDistillConfig`, :class:`EmbeddingDistillConfig`,
:class:`StaticDistillConfig`, the blocks they share (:class:`LossWeights`, :class:`AugmentConfig`) and the names of
the loss terms they are checked against.

Kept apart from the modules that distil (torch, transformers) so that a command's flags and its config checks cost
no heavy import. The terms themselves are registered under these names in :mod:`compress.distill.terms` and
:mod:`compress.distill.embedding` (tests/test_startup.py keeps the names and the registries equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from compress.core.config import check_name, flat_keywords, option
from compress.core.data.config import TaskData
from compress.core.data.tasks import GLUE_TASKS, Task, get_task, is_kind, task_choices
from compress.core.errors import CompressError
from compress.core.lazy import load
from compress.core.model.shapes import TEACHER_METHODS, StudentShape
from compress.core.train_config import TrainConfig

# The terms of a task distillation (compress.distill.terms.TERMS): prediction terms, then intermediate ones.
PREDICTION_TERMS = ("kd", "hard")
INTERMEDIATE_TERMS = ("hidden", "embedding", "attention", "cosine", "minilm")
TASK_TERMS = (*PREDICTION_TERMS, *INTERMEDIATE_TERMS)
# The terms of a sentence-embedding student (compress.distill.embedding): per sentence (a static student's too), and
# a transformer student's similarity of the sentences of a batch.
SENTENCE_TERMS = ("mse", "cosine")
STUDENT_SENTENCE_TERMS = (*SENTENCE_TERMS, "similarity")


# ---------------------------------------------------------------------------- shared blocks


@dataclass(frozen=True)
class LossWeights:
    """How the loss terms are weighted and mapped (shared by task and general distillation)."""

    alpha: float = option(0.5, "weight of kd against hard (mlm in general distillation): alpha*kd + (1-alpha)*hard")
    temperature: float = option(2.0, "softmax temperature of the kd term (the KL is multiplied by T^2)")
    hidden_weight: float = option(1.0, "weight of the hidden term")
    embedding_weight: float = option(1.0, "weight of the embedding term")
    attention_weight: float = option(1.0, "weight of the attention term")
    cosine_weight: float = option(1.0, "weight of the cosine term")
    minilm_weight: float = option(1.0, "weight of the minilm term")
    relation_heads: int = option(12, "minilm: heads the value relations are split into")
    layer_map: str = option("uniform", "student<-teacher layers for intermediate terms: uniform, last, 2,4,6 or 1:2,2:4")

    def validate(self) -> None:
        if not 0 <= self.alpha <= 1:
            raise CompressError(f"--alpha must be in [0, 1], got {self.alpha}")
        if self.temperature <= 0:
            raise CompressError(f"--temperature must be positive, got {self.temperature}")
        if self.relation_heads < 1:
            raise CompressError(f"--relation-heads must be at least 1, got {self.relation_heads}")


# The default, chosen by the retention benchmark (bench/results/2026-11-25/retention: MiniLM-L6 teachers,
# 3L-384 students, 2.5k-4k training examples): 4 copies kept 98.1% of STS-B (defaults without: 90.8%),
# 98.7% of SST-2 (95.7%), 96.2% of MRPC (94.4%), 96.3% of RTE (96.3%). Larger sets are left as they are:
# their gain was not measured and the copies multiply the training time.
AUTO_COPIES = 4
AUTO_MAX_EXAMPLES = 10_000


@dataclass(frozen=True)
class AugmentConfig:
    augment: int | None = option(None, "augmented copies per training example, labelled by the teacher only (TinyBERT: 20; "
                                 f"0: none; default: {AUTO_COPIES} for a sentence task of at most {AUTO_MAX_EXAMPLES:,} "
                                 "training examples, else 0)", metavar="N")
    augment_prob: float = option(0.4, "probability that a word of an augmented copy is replaced (TinyBERT: p = 0.4)")
    augment_candidates: int = option(15, "candidate words per word (TinyBERT: K = 15)")
    augment_mlm: str | None = option(None, "masked-LM model DIR whose predictions are the candidates (default: the teacher's MLM "
                                     "head when its folder has one, else nearest neighbours in its input embeddings)", metavar="DIR")
    augment_intermediate: bool = option(False, "with --two-stage, also run the intermediate stage on the augmented rows "
                                        "(TinyBERT does; the teacher runs alongside, so it costs N+1 times as much)")
    transfer_text: tuple[str, ...] = option((), "unlabelled text the teacher scores: corpus files or folders, hf:NAME, a "
                                            "save_to_disk folder, or task:NAME (another GLUE task's training texts)", metavar="SOURCE[,...]")
    transfer_examples: int | None = option(None, "at most this many transfer examples (default: as many as the training set)")

    def validate(self) -> None:
        if self.augment is not None and self.augment < 0:
            raise CompressError(f"--augment must be 0 (none) or a number of copies, got {self.augment}")
        if not 0 <= self.augment_prob <= 1:
            raise CompressError(f"--augment-prob must be in [0, 1], got {self.augment_prob}")
        if self.augment_candidates < 1:
            raise CompressError(f"--augment-candidates must be at least 1, got {self.augment_candidates}")
        if self.transfer_examples is not None and self.transfer_examples < 1:
            raise CompressError(f"--transfer-examples must be at least 1, got {self.transfer_examples}")

    @property
    def active(self) -> bool:
        """Whether extra rows were asked for (the automatic default asks for nothing: it steps aside)."""
        return bool(self.augment) or bool(self.transfer_text)

    def copies(self, n_train: int, *, spans: bool, soft_targets: bool) -> int:
        """Copies per example for a training set of ``n_train`` examples: ``--augment``, else the default.

        The default augments only where it was measured to help and can: a sentence task
        (``spans`` False), a loss that reads teacher targets, at most AUTO_MAX_EXAMPLES examples.
        """
        if self.augment is not None:
            return self.augment
        return AUTO_COPIES if not spans and soft_targets and n_train <= AUTO_MAX_EXAMPLES else 0


# ---------------------------------------------------------------------------- task distillation


def _distill_defaults() -> TrainConfig:
    return TrainConfig(lr=1e-4, epochs=3, batch_size=32, warmup_ratio=0.1)


@flat_keywords
@dataclass(frozen=True)
class DistillConfig:
    task: str = option("", "task to distil on (default: the teacher's own task; a kind of your own data with "
                       "--train-file for a teacher that records none)", choices=task_choices)
    shape: StudentShape = field(default_factory=StudentShape)
    init_from: str | None = option(None, "cut the student from this encoder DIR instead of the teacher (--init teacher, "
                                   "teacher-layers or teacher-slices); its task head starts new", metavar="DIR")
    losses: tuple[str, ...] = option(("kd", "hard"), "loss terms: the prediction terms kd, hard and the intermediate terms "
                                     "hidden, embedding, attention, cosine, minilm (they match the teacher's hidden states, "
                                     "attention or embeddings, at a cost in training time). A student with a tokenizer of its "
                                     "own (--init DIR, e.g. a MiniLM under an MPNet teacher) tokenises the text itself and "
                                     "takes kd (met per example, per word for tags) and hard only; on SQuAD kd meets at the start/end "
                                     "boundaries both tokenizations share",
                                     metavar="TERM[,...]")
    loss: LossWeights = field(default_factory=LossWeights)
    two_stage: bool = option(False, "TinyBERT's order: train on the intermediate terms first (--intermediate-epochs), then on "
                             "the prediction terms; --losses needs some of each")
    intermediate_epochs: int | None = option(None, "epochs of the intermediate stage (default: --epochs)")
    cache: bool = option(True, "cache teacher outputs on disk when the terms allow (teacher runs once)")
    cache_hidden: bool = option(False, "also cache the mapped teacher hidden states (float16 on disk)")
    cache_dir: str | None = option(None, "where teacher outputs are cached (default: $COMPRESS_CACHE or ~/.cache/compress)", metavar="DIR")
    resume: bool = option(False, "continue an interrupted run from its last checkpoint into the same --out")
    extra_data: AugmentConfig = field(default_factory=AugmentConfig)
    data: TaskData = field(default_factory=TaskData)
    train: TrainConfig = field(default_factory=_distill_defaults)

    def validate(self) -> None:
        if self.task and not is_kind(self.task):
            check_extra_data(get_task(self.task), self)
        if self.extra_data.active:
            if "kd" not in self.losses and not set(self.losses) & set(INTERMEDIATE_TERMS):
                raise CompressError("augmented and transfer examples have no gold labels, only teacher targets: "
                                    "add kd (or an intermediate term) to --losses")
        for term in self.losses:
            check_name("distillation loss", term, TASK_TERMS)
        if not self.losses:
            raise CompressError("--losses is empty; pass e.g. --losses kd,hard")
        if self.two_stage and not (set(self.losses) & set(INTERMEDIATE_TERMS) and set(self.losses) & set(PREDICTION_TERMS)):
            raise CompressError("--two-stage needs intermediate terms (hidden, attention, ...) and prediction terms (kd, hard)")
        if self.init_from and self.shape.init not in TEACHER_METHODS:
            raise CompressError(f"--init-from cuts the student from another encoder: use it with --init {', '.join(TEACHER_METHODS)}, "
                                f"not --init {self.shape.init}")


def check_extra_data(task: Task, cfg: DistillConfig) -> None:
    """Refuse augmented or transfer rows where they cannot be made: spans (SQuAD) and tagged words (NER).

    TinyBERT's word replacement would change the words an entity tag belongs to (and transfer
    text has no words aligned with tags), so a token-classification task is refused rather
    than given rows whose teacher targets sit on other words.
    """
    what = task.behaviour.not_augmentable
    if not cfg.extra_data.active or not what:
        return
    raise CompressError(f"--augment/--transfer-text make sentence-task examples; {task.display}'s {what}: "
                        "pass --augment 0 and no --transfer-text")


# ---------------------------------------------------------------------------- general distillation


def _general_defaults() -> TrainConfig:
    return TrainConfig(lr=5e-4, batch_size=64, max_steps=1000, warmup_ratio=0.05, log_every=10, save_every=200)


@flat_keywords
@dataclass(frozen=True)
class GeneralDistillConfig:
    corpus: tuple[str, ...] = option(
        (), "text files or folders of *.txt (documents separated by blank lines), datasets save_to_disk folders, or hf:NAME[:CONFIG]",
        metavar="PATH[,...]")
    shape: StudentShape = field(default_factory=lambda: StudentShape(student="4L-312"))
    losses: tuple[str, ...] = option(
        ("minilm",), "terms: minilm, hidden, attention, embedding, cosine; kd + mlm (DistilBERT) need MLM heads", metavar="TERM[,...]"
    )
    max_length: int = option(128, "tokens per training sequence (contiguous text)")
    mlm_probability: float = option(0.15, "fraction of tokens masked for the mlm/kd terms")
    loss: LossWeights = field(default_factory=LossWeights)
    heldout_fraction: float = option(0.01, "sequences held out to report the distillation loss")
    resume: bool = option(False, "continue an interrupted run from its last checkpoint into the same --out")
    train: TrainConfig = field(default_factory=_general_defaults)

    def validate(self) -> None:
        if not self.corpus:
            raise CompressError("no corpus given; pass --corpus FILE_OR_DIR[,...]")
        for term in self.losses:
            if term not in ("minilm", "hidden", "attention", "embedding", "cosine", "kd", "mlm"):
                raise CompressError(
                    f"unknown general distillation loss {term!r}; valid: minilm, hidden, attention, embedding, cosine, kd, mlm"
                )
        if self.max_length < 8:
            raise CompressError(f"--max-length {self.max_length} is too short; use at least 8")


# ---------------------------------------------------------------------------- sentence embeddings


def _embedding_defaults() -> TrainConfig:
    return TrainConfig(lr=1e-4, epochs=1, batch_size=64, warmup_ratio=0.05, log_every=20)


@flat_keywords
@dataclass(frozen=True)
class EmbeddingDistillConfig:
    corpus: tuple[str, ...] = option(
        (), "unlabelled text: text files or folders of *.txt (split into sentences), datasets save_to_disk folders, or hf:NAME[:CONFIG]",
        metavar="PATH[,...]")
    sentences_from: tuple[str, ...] = option(
        (), "GLUE tasks whose training sentences are added as unlabelled text (both sides of a pair; labels unused)",
        metavar="TASK[,...]")
    data_dir: str | None = option(None, "GLUE root or task folder for --sentences-from and --eval-tasks (default: the hub)", metavar="DIR")
    max_sentences: int | None = option(None, "train on a seeded random sample of N sentences (say so when reporting)")
    min_words: int = option(3, "drop sentences with fewer words (headings, list markers)")
    heldout_sentences: int = option(500, "sentences held out (at most a tenth) to report, and keep the best checkpoint by, the loss")
    # no wider than the teacher; a narrower one learns the teacher's embeddings reduced to its width by PCA
    shape: StudentShape = field(default_factory=lambda: StudentShape(student="3L-384"))
    losses: tuple[str, ...] = option(
        ("mse", "cosine"), "terms: mse (pooled embeddings, before normalisation), cosine (1 - cos), both per sentence "
        "(against the teacher's PCA-reduced embeddings for a narrower student); similarity (MSE between the in-batch "
        "cosine-similarity matrices, the teacher's at its full width)", metavar="TERM[,...]")
    mse_weight: float = option(1.0, "weight of the mse term")
    cosine_weight: float = option(1.0, "weight of the cosine term")
    similarity_weight: float = option(1.0, "weight of the similarity term")
    max_length: int = option(128, "tokens per training sentence (longer ones are truncated; the folder keeps its max_seq_length)")
    eval_tasks: tuple[str, ...] = option(
        (), "pair tasks scored on the student's embeddings at each evaluation and at the end, with the teacher's score "
        "for retention: stsb (cosine Spearman), mrpc, qqp, rte ... (retrieval MRR)", metavar="TASK[,...]")
    teacher_batch_size: int = option(128, "sentences per teacher forward pass (its embeddings are computed once, before training)")
    resume: bool = option(False, "continue an interrupted run from its last checkpoint into the same --out")
    train: TrainConfig = field(default_factory=_embedding_defaults)

    def validate(self) -> None:
        if not self.corpus and not self.sentences_from:
            raise CompressError("no sentences to distil on; pass --corpus FILE_OR_DIR[,...] and/or --sentences-from TASK[,...]")
        check_sentence_options(self, STUDENT_SENTENCE_TERMS)
        if self.max_length < 8:
            raise CompressError(f"--max-length {self.max_length} is too short; use at least 8")


def check_sentence_options(cfg, terms: tuple[str, ...] = SENTENCE_TERMS) -> None:
    """The sentence sources, eval tasks, loss terms (of ``terms``) and counts an embedding distillation config holds
    (the transformer student's, the static student's), each refused in one line."""
    for name in cfg.sentences_from:
        if get_task(name).name not in GLUE_TASKS:
            raise CompressError(f"--sentences-from takes GLUE tasks ({', '.join(GLUE_TASKS)}), not {name!r}")
    if cfg.eval_tasks:  # named, not imported: the scoring module is heavy (torch, scikit-learn) and only a run checks this
        check_embedding_task = load("compress.eval.embeddings:check_embedding_task")
        for name in cfg.eval_tasks:
            check_embedding_task(get_task(name))
    for term in cfg.losses:
        check_name("embedding distillation loss", term, terms)
    if not cfg.losses:
        raise CompressError("--losses is empty; pass e.g. --losses mse,cosine")
    if cfg.min_words < 1 or cfg.heldout_sentences < 0 or cfg.teacher_batch_size < 1:
        raise CompressError("--min-words and --teacher-batch-size must be at least 1, --heldout-sentences at least 0")
    if cfg.max_sentences is not None and cfg.max_sentences < 1:
        raise CompressError(f"--max-sentences must be at least 1, got {cfg.max_sentences}")


def _static_defaults() -> TrainConfig:
    # No weight decay: a token vector's length is its weight in the mean (what SIF set), which decay would wear down.
    return TrainConfig(lr=5e-2, epochs=3, batch_size=64, weight_decay=0.0, warmup_ratio=0.0, log_every=20)


@flat_keywords
@dataclass(frozen=True)
class StaticDistillConfig:
    pca_dims: int | None = option(256, "PCA components kept of each token vector (none: the teacher's width, no PCA); "
                                  "at most the teacher's width")
    sif_coefficient: float | None = option(1e-4, "SIF weight a/(a+p) of a token whose Zipf-estimated frequency is p, "
                                           "from its rank in the vocabulary (none: no weighting)")
    token_remove_pattern: str | None = option(r"\[unused\d+\]", "leave out the teacher's tokens this regex matches "
                                              "(none: keep every token)", metavar="REGEX")
    corpus: tuple[str, ...] = option(
        (), "refine on unlabelled text: text files or folders of *.txt (split into sentences), datasets save_to_disk "
        "folders, or hf:NAME[:CONFIG]", metavar="PATH[,...]")
    sentences_from: tuple[str, ...] = option(
        (), "GLUE tasks whose training sentences are added to the refinement text (both sides of a pair; labels unused)",
        metavar="TASK[,...]")
    data_dir: str | None = option(None, "GLUE root or task folder for --sentences-from and --eval-tasks (default: the hub)", metavar="DIR")
    max_sentences: int | None = option(None, "refine on a seeded random sample of N sentences (say so when reporting)")
    min_words: int = option(3, "drop sentences with fewer words (headings, list markers)")
    heldout_sentences: int = option(500, "sentences held out (at most a tenth) to report, and keep the best epoch by, the loss")
    losses: tuple[str, ...] = option(
        ("mse", "cosine"), "refinement terms on a sentence's mean token vector against the teacher's embedding (in the "
        "static space, normalised, at the mean's starting length): mse, cosine (1 - cos)", metavar="TERM[,...]")
    mse_weight: float = option(1.0, "weight of the mse term")
    cosine_weight: float = option(1.0, "weight of the cosine term")
    eval_tasks: tuple[str, ...] = option(
        (), "pair tasks scored on the static model's embeddings and the teacher's, for retention: stsb (cosine "
        "Spearman), mrpc, qqp, rte ... (retrieval MRR)", metavar="TASK[,...]")
    teacher_batch_size: int = option(128, "sentences per teacher forward pass (its embeddings are computed once)")
    train: TrainConfig = field(default_factory=_static_defaults)

    @property
    def refining(self) -> bool:
        return bool(self.corpus or self.sentences_from)

    def validate(self) -> None:
        if self.pca_dims is not None and self.pca_dims < 1:
            raise CompressError(f"--pca-dims must be at least 1 (or none: no PCA), got {self.pca_dims}")
        if self.sif_coefficient is not None and not 0 < self.sif_coefficient < 1:
            raise CompressError(f"--sif-coefficient must be in (0, 1) (or none: no weighting), got {self.sif_coefficient}")
        if self.token_remove_pattern is not None:
            try:
                re.compile(self.token_remove_pattern)
            except re.error as err:
                raise CompressError(f"--token-remove-pattern {self.token_remove_pattern!r} is not a regex: {err}") from None
        check_sentence_options(self)
        if not self.refining:
            self._no_refinement_options()

    def _no_refinement_options(self) -> None:
        """Without sentences there is no refinement: an option that only tunes it is a mistake, said in one line."""
        defaults = StaticDistillConfig()
        unused = [f"--{f.name.replace('_', '-')}" for f in fields(self)
                  if f.name in REFINEMENT_OPTIONS and getattr(self, f.name) != getattr(defaults, f.name)]
        unused += [f"--{f.name.replace('_', '-')}" for f in fields(self.train)
                   if f.name != "device" and getattr(self.train, f.name) != getattr(defaults.train, f.name)]
        if unused:
            raise CompressError(f"{unused[0]} tunes the refinement, which needs sentences: pass --corpus FILE_OR_DIR[,...] "
                                "and/or --sentences-from TASK[,...], or leave it out")


# Options that only tune the refinement (with the training options of ``train``, the device aside).
REFINEMENT_OPTIONS = ("max_sentences", "min_words", "heldout_sentences", "losses", "mse_weight", "cosine_weight",
                      "teacher_batch_size")
