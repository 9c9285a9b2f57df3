"""The options of the measuring commands: :class:`EvalConfig` (``compress eval``), :class:`HeadsConfig`
(``compress heads``) and :class:`LeaderboardConfig` (``compress leaderboard``).

Kept apart from the modules that measure (torch, transformers, scikit-learn) so that a command's flags and its
config checks cost no heavy import; ``compress latency``'s options are :mod:`compress.eval.latency.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from compress.core.config import SEEDS, flat_keywords, option
from compress.core.data.config import EVAL_BATCH_SIZE, DataSource, TaskData, TaskOptions, check_max_length
from compress.core.data.tasks import get_task, is_kind, task_choices
from compress.core.errors import CompressError
from compress.core.paths import check_input_file

# The records each table split reads: MNLI reports matched as its primary dev (and test) split.
SPLITS = {"dev": ("dev", "dev_matched"), "test": ("test", "test_matched")}


@flat_keywords
@dataclass(frozen=True)
class EvalConfig:
    task: str = option("", "task to evaluate on (default: the model's own task, from its compression.json or config.json)",
                       choices=task_choices)
    embedding: bool = option(False, "score sentence embeddings (cosine, no fine-tuning; pooling as a sentence-transformers folder says): "
                                    "stsb Pearson/Spearman, or retrieval on a pair task such as mrpc (recall@1, MRR)")
    split: str = option("dev", "dev, test, train, or an exact split such as dev_mismatched (MNLI)")
    data_dir: str | None = option(None, "local GLUE root / task folder / folder of SQuAD JSON files (default: the hub)", metavar="DIR")
    data_file: str | None = option(None, "one csv/tsv/json/jsonl/parquet/CoNLL/SQuAD JSON file (or a datasets save_to_disk "
                                   "folder) holding the split", metavar="FILE")
    columns: tuple[str, ...] = option((), "FIELD=COLUMN pairs mapping --data-file columns to task fields, e.g. sentence=text,label=stars", metavar="FIELD=COL[,...]")
    max_eval_examples: int | None = option(None, "evaluate on the first N examples only")
    eval_batch_size: int = option(EVAL_BATCH_SIZE, "sequences per forward pass when evaluating")
    max_length: int | None = option(None, "tokens per sequence (default: 128 for GLUE, 384 for SQuAD, the folder's max_seq_length with --embedding)")
    doc_stride: int = option(128, "SQuAD: overlap between windows of a long context, in tokens")
    n_best: int = option(20, "SQuAD: start/end candidates considered per window")
    max_answer_length: int = option(30, "SQuAD: longest answer span, in tokens")
    null_threshold: float = option(0.0, "SQuAD v2.0: predict no answer when null score - best span score exceeds this")
    submission: str | None = option(None, "directory for GLUE server files (test split): TSVs + submission.zip", metavar="DIR")
    predictions: str | None = option(None, "directory for prediction files (default: MODEL/predictions; none with --no-record)", metavar="DIR")
    record: bool = option(True, "append the results to the model's metrics.json and write predictions to MODEL/predictions; "
                                "--no-record writes nothing into the model directory")
    device: str = option("auto", "auto, cpu, cuda, cuda:1, mps")
    own: TaskOptions = field(default_factory=TaskOptions)
    runtime: str = option("auto", "what runs the model: auto (the folder's own format: PyTorch for an fp32 folder), or "
                          "openvino (an fp32 PyTorch or ONNX folder converted in a temporary folder and run by OpenVINO "
                          "in f32 on the CPU, with the same outputs to float tolerance)",
                          choices=("auto", "openvino"))

    def validate(self) -> None:
        if self.runtime not in ("auto", "openvino"):
            raise CompressError(f"--runtime must be auto or openvino, got {self.runtime!r}")
        if self.runtime == "openvino" and self.device not in ("auto", "cpu"):
            raise CompressError(f"--runtime openvino runs on the CPU; drop --device {self.device} or --runtime")
        if self.eval_batch_size < 1:
            raise CompressError(f"--eval-batch-size must be at least 1, got {self.eval_batch_size}")
        if self.max_eval_examples is not None and self.max_eval_examples < 1:
            raise CompressError(f"--max-eval-examples must be at least 1, got {self.max_eval_examples}")
        if self.max_length is not None:  # 0 is a length to refuse, not "the default"
            check_max_length(self.max_length, None)
        for pair in self.columns:
            if "=" not in pair:
                raise CompressError(f"--columns expects FIELD=COLUMN pairs, got {pair!r}")
        if self.columns and not self.data_file:
            raise CompressError("--columns maps the columns of --data-file; pass --data-file too")
        if self.data_dir and self.data_file:
            raise CompressError("pass either --data-dir or --data-file, not both")
        if self.embedding and self.task and not is_kind(self.task):  # said before any data is looked for
            task = get_task(self.task)
            unlabelled = [s.name for s in task.resolve_splits(self.split) if not s.labelled]
            if unlabelled:
                raise CompressError(f"{task.display} {unlabelled[0]} has no labels to score embeddings against; "
                                    "use --split dev")

    def source(self) -> DataSource:
        """Where the split comes from: --data-file (its --columns mapped), --data-dir, or the hub."""
        columns = tuple(tuple(p.split("=", 1)) for p in self.columns)
        return DataSource(data_dir=self.data_dir, data_file=self.data_file, columns=columns)


@flat_keywords
@dataclass(frozen=True)
class HeadsConfig:
    task: str | None = option(None, "task whose dev inputs are analysed; adds gradient importance and the pruning curve "
                              "(default with --train-file/--dev-file: the model's own task)", choices=task_choices)
    text: str | None = option(None, "instead of --task: a text file, one input per line (a tab separates a sentence pair)", metavar="FILE")
    attention_examples: int = option(256, "inputs used for the attention statistics")
    js_examples: int = option(32, "of those, inputs used for the head-to-head Jensen-Shannon distances")
    attention_batch_size: int = option(16, "sequences per forward pass for the attention statistics and the importance scores")
    importance_examples: int = option(256, "with a task: training examples used to score head importance")
    curve: bool = option(True, "with a task: dev metric as heads are masked by importance vs at random (Michel et al.)")
    curve_steps: int = option(10, "pruning-curve points: fractions 0, 1/N, ..., (N-1)/N of the heads masked")
    seed: int = option(0, "seed for the random masking order, the importance sample and the MDS layout",
                      bounds=SEEDS)
    # --max-length (default 128; 384 for SQuAD), --data-dir, --max-eval-examples (dev set of the curve), ...
    data: TaskData = field(default_factory=TaskData)

    def validate(self) -> None:
        if self.task and self.text:
            raise CompressError("pass either --task or --text, not both")
        if not self.has_task and not self.text:
            raise CompressError("nothing to analyse: pass --task TASK (with --data-dir), your task's --train-file and "
                                "--dev-file, or --text FILE (one input per line)")
        if self.task and not is_kind(self.task):
            get_task(self.task)
        if self.text:
            check_input_file(self.text, "--text")  # a FIFO, a device, a directory, an empty file: named as such
            if self.data.data_dir or self.data.train_file or self.data.dev_file:
                raise CompressError("--data-dir/--train-file/--dev-file read task data; with --text they are not used")
        if self.data.max_train_examples is not None:
            raise CompressError("use --importance-examples to choose how many training examples score the heads")
        for name in ("attention_examples", "js_examples", "attention_batch_size", "importance_examples"):
            if getattr(self, name) < 1:
                raise CompressError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.curve_steps < 2:
            raise CompressError(f"--curve-steps must be at least 2 (fraction 0 plus one masked point), got {self.curve_steps}")
        self.data.validate()

    @property
    def has_task(self) -> bool:
        """Whether a task's data is given: a task name, or a user's files (the task is then the model's own)."""
        return bool(self.task or self.data.train_file)


@dataclass(frozen=True)
class LeaderboardConfig:
    baseline: str | None = option(None, "model directory every model is compared with (retention, speed-up) "
                                  "instead of its teacher", metavar="DIR")
    compare_with: Literal["teacher", "parent"] = option(
        "teacher", "without --baseline, compare each model with the teacher of its chain (its oldest ancestor shown "
        "that has a score) or with its parent (its nearest ancestor shown); a model with neither: the first row")
    speed_reference: str | None = option(None, "model directory for an extra speed-up column, e.g. a BERT-base-shaped model",
                                         flag="--reference-model", metavar="DIR")
    batch: int = option(1, "batch size of the latency point shown in the table")
    seq: int = option(128, "sequence length of the latency point shown in the table")
    tasks: tuple[str, ...] = option((), "tasks to show: benchmark tasks or the names of your own tasks (default: every task "
                                    "some model was evaluated on)", metavar="TASK[,...]")
    published: bool = option(True, "add the published results of eval/references.py (flagged, never mixed with measured ones)")
    split: Literal["dev", "test"] = option(
        "dev", "which evaluation the table shows: each model's latest dev one (MNLI: matched), or its latest test one (your "
        "own task scored on its --test-file, or by compress eval --split test); published rows of that split only")

    def validate(self) -> None:
        """Refuse a latency point below 1 and an unknown split (task names are checked against the models' tasks)."""
        if self.batch < 1:
            raise CompressError(f"--batch must be at least 1, got {self.batch}")
        if self.seq < 1:
            raise CompressError(f"--seq must be at least 1, got {self.seq}")
        if self.split not in SPLITS:
            raise CompressError(f"--split must be one of {', '.join(SPLITS)}, got {self.split!r}")
