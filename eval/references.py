"""Published results to compare against, each with its source.

Numbers are as printed by the cited papers and official repositories (percent), copied from
/work/shared/REFERENCES.md: each row records the document they were copied from (``source``),
and the paper and table they are from where REFERENCES.md names them (None: not named there,
never guessed), and the split. They are facts about other people's runs: reports always mark
them "published", never "measured"; rows of the table's split stand beside local results of that
split (and enter its average and ranking only over the same tasks), rows of the other split
stand in a block of their own, never averaged or ranked with them (a user's task is often
scored on its test file).

Rows of tasks that are not presets (Banking77, WNUT-17) are keyed by the name a user's own
task gets from its folder (``banking77/train.csv`` -> ``banking77``, as ``bench/own_data.py``
names them) and carry their ``metric``: a local task of that name is compared with them only
when its primary metric is the same one.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Published:
    model: str
    params_m: float | None  # millions of parameters
    scores: dict[str, float]  # task -> primary metric (percent)
    source: str
    split: str = "dev"
    shape: str | None = None  # layers-hidden, for matching a local model's shape
    notes: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    metric: str | None = None  # the metric of every score, for tasks that are not presets (None: the preset's primary)
    paper: str | None = None  # the paper the figures are from, where the source names one (None: not named)
    table: str | None = None  # that paper's table, where the source names one (None: not named)

    @property
    def origin(self) -> str:
        """Paper and table (or that none is cited) and the document the figures were copied from, in one line."""
        where = ", ".join(part for part in (self.paper, self.table) if part)
        if not where:
            return f"{self.source} (no paper table cited)"
        if self.table is None:
            return f"{where}, table not named (via {self.source})"
        return where if self.source.startswith(where) else f"{where} (via {self.source})"

    @property
    def cite(self) -> str:
        """:attr:`origin` and the split: "BERT paper, Table 1 (via ...); test set"."""
        return f"{self.origin}; {self.split} set"


_HF_DISTIL = "huggingface/transformers examples/research_projects/distillation/README.md"
_MINILM = "microsoft/unilm minilm/README.md"
_TINYBERT_QUOTED = "quoted in henrform/DLNLP_25W_Group4 README.md"
_TORCHDISTILL = "yoshitomo-matsubara/torchdistill configs README"
# REFERENCES.md files the two TinyBERT rows under GLUE dev, as a README quotes them ("TinyBERT_4 (paper)", no split
# named there). They are the TinyBERT paper's own figures and that paper's main GLUE table is the official test
# server's (Papers with Code, for one, lists TinyBERT-6's SST-2 93.1 under GLUE test and its CoLA dev as 54, not this
# 51.1). A test figure in a dev average would flatter or sink every row beside it: these stand with the test rows.
_TINYBERT_SPLIT = ("the README quoting them sets them beside its own dev-set runs, but the TinyBERT paper reports these "
                   "figures on the GLUE test server: shown with the test rows, never averaged or ranked with dev ones")

# GLUE dev. Metrics: CoLA Matthews, SST-2 acc, MRPC F1, STS-B Pearson, QQP acc, MNLI-m acc,
# QNLI acc, RTE acc, WNLI acc (the primary metrics of compress.core.data.tasks).
GLUE_DEV: tuple[Published, ...] = (
    Published("BERT-base-uncased", 110, {"cola": 56.3, "sst2": 92.7, "mrpc": 88.6, "stsb": 89.0, "qqp": 89.6,
              "mnli": 84.7, "qnli": 91.8, "rte": 69.3, "wnli": 53.5}, _HF_DISTIL, shape="12L-768"),
    Published("DistilBERT-base-uncased (6L-768)", 66, {"cola": 51.3, "sst2": 91.3, "mrpc": 87.5, "stsb": 86.9,
              "qqp": 88.5, "mnli": 82.1, "qnli": 89.2, "rte": 59.9, "wnli": 56.3}, _HF_DISTIL, shape="6L-768"),
    Published("BERT-base (MiniLM authors' run)", 110, {"cola": 58.9, "sst2": 93.2, "mrpc": 87.3, "qqp": 91.3,
              "mnli": 84.5, "qnli": 91.7, "rte": 68.6}, _MINILM, shape="12L-768"),
    Published("MiniLM-L12-H384", 33, {"cola": 58.5, "sst2": 93.0, "mrpc": 89.5, "qqp": 91.3, "mnli": 85.7,
              "qnli": 91.5, "rte": 73.3}, _MINILM, shape="12L-384"),
    Published("MiniLM-L6-H384", 22, {"cola": 47.5, "sst2": 91.5, "mrpc": 88.9, "qqp": 90.6, "mnli": 83.3,
              "qnli": 90.5, "rte": 68.8}, _MINILM, shape="6L-384"),
    Published("BERT-of-Theseus (6L)", 66, {"sst2": 91.8, "mrpc": 87.5, "stsb": 87.8, "qqp": 88.8, "mnli": 82.1,
              "qnli": 88.8, "rte": 70.1}, "JetRunner/BERT-of-Theseus README.md", shape="6L-768"),
)

# GLUE test server (score = the GLUE average, as published).
GLUE_TEST: tuple[Published, ...] = (
    Published("BERT-base (Devlin et al.)", 110, {"mnli": 84.6, "qqp": 71.2, "qnli": 90.5, "sst2": 93.5, "cola": 52.1,
              "stsb": 85.8, "mrpc": 88.9, "rte": 66.4}, _TORCHDISTILL, split="test",
              extra={"mnli-mm": 83.4, "score": 79.6}, paper="BERT paper", table="Table 1"),
    Published("BERT-large (Devlin et al.)", 340, {"mnli": 86.7, "qqp": 72.1, "qnli": 92.7, "sst2": 94.9, "cola": 60.5,
              "stsb": 86.5, "mrpc": 89.3, "rte": 70.1}, _TORCHDISTILL, split="test",
              extra={"mnli-mm": 85.9}, paper="BERT paper", table="Table 1"),
    Published("MobileBERT", 25.3, {}, "MobileBERT abstract", split="test", extra={"score": 77.7}),
    Published("TinyBERT-4L-312", 14.5, {"cola": 44.1, "sst2": 92.6, "mrpc": 86.4, "rte": 66.6}, _TINYBERT_QUOTED,
              split="test", shape="4L-312", paper="TinyBERT paper", notes=_TINYBERT_SPLIT),
    Published("TinyBERT-6L-768", 67, {"cola": 51.1, "sst2": 93.1, "mrpc": 87.3, "rte": 70.0}, _TINYBERT_QUOTED,
              split="test", shape="6L-768", paper="TinyBERT paper", notes=_TINYBERT_SPLIT),
)

# The GLUE comparison rows the leaderboard is meant to carry, by model-name prefix (dev or test). A name with no row
# in GLUE_DEV or GLUE_TEST is a known gap: REFERENCES.md has no figures for it (none today).
WANTED_GLUE = ("BERT-base", "DistilBERT", "MiniLM-L6", "TinyBERT-4", "TinyBERT-6", "BERT-of-Theseus")

# SQuAD dev: F1 (and EM where published).
SQUAD_DEV: tuple[Published, ...] = (
    Published("BERT-base", 110, {"squad": 88.5, "squad_v2": 76.8}, "BERT paper; unilm minilm README (v2.0)",
              extra={"squad_em": 80.8}, shape="12L-768"),
    Published("BERT-large", 340, {"squad": 90.9}, "BERT paper", extra={"squad_em": 84.1}, shape="24L-1024"),
    Published("DistilBERT", 66, {"squad": 86.9}, _HF_DISTIL, notes="with SQuAD-stage distillation", shape="6L-768"),
    Published("TinyBERT-4L", 14.5, {"squad": 82.1}, "TextBrewer README", extra={"squad_em": 72.7}, shape="4L-312"),
    Published("MobileBERT", 25.3, {"squad": 90.0, "squad_v2": 79.2}, "MobileBERT abstract"),
    Published("MiniLM-L12-H384", 33, {"squad_v2": 81.7}, _MINILM, shape="12L-384"),
    Published("MiniLM-L6-H384", 22, {"squad_v2": 75.6}, _MINILM, shape="6L-384"),
)


# A user's own tasks of public datasets, test sets (the splits their papers report). The test files are the
# official ones: Banking77's 3,080 queries (PolyAI-LDN/task-specific-datasets), WNUT-17's emerging.test.annotated.
OWN_TEST: tuple[Published, ...] = (
    Published("BERT-base", 110, {"banking77": 93.02},
              "Mehri et al. 2020, DialoGLUE (arXiv 2009.13570), Table 1 (full data)", split="test", shape="12L-768",
              metric="accuracy", paper="Mehri et al. 2020, DialoGLUE (arXiv 2009.13570)", table="Table 1 (full data)",
              notes="trained on DialoGLUE's train split, its validation split held out; the figure as a "
              "public README quotes the paper's table (the PDF was not at hand offline)"),
    Published("BERT-Large, fine-tuned ('BERT-Tuned')", 340, {"banking77": 93.66},
              "Casanueva et al. 2020, Efficient Intent Detection with Dual Sentence Encoders (arXiv 2003.04807), Table 3",
              split="test", shape="24L-1024", metric="accuracy", table="Table 3",
              paper="Casanueva et al. 2020, Efficient Intent Detection with Dual Sentence Encoders (arXiv 2003.04807)",
              notes="all 10,003 training examples; the figure as a "
              "public README quotes the paper's table (the PDF was not at hand offline)"),
    Published("bert-large-cased", 340, {"wnut17": 47.44},
              "huggingface/transformers examples/legacy/token-classification/README.md (WNUT'17, test eval_f1 0.4744)",
              split="test", shape="24L-1024", metric="entity_f1", notes="3 epochs, max length 128, seed 1"),
)

ALL: tuple[Published, ...] = GLUE_DEV + SQUAD_DEV + GLUE_TEST + OWN_TEST


def for_split(split: str) -> tuple[Published, ...]:
    """The published rows of one split (dev or test), to show beside local results of that split only."""
    return tuple(p for p in ALL if p.split == split)


def published(model: str, table: tuple[Published, ...] = GLUE_DEV + SQUAD_DEV) -> list[Published]:
    """Rows whose model name starts with ``model`` (case-insensitive)."""
    return [p for p in table if p.model.lower().startswith(model.lower())]


def published_score(model: str, task: str) -> tuple[float, str] | None:
    """The first published dev score of ``model`` on ``task``, with its source."""
    for row in published(model):
        if task in row.scores:
            return row.scores[task], row.source
    return None


def wanted_rows(wanted: tuple[str, ...] = WANTED_GLUE) -> dict[str, tuple[Published, ...]]:
    """Each wanted name's published GLUE rows, dev and test; an empty tuple is a gap REFERENCES.md leaves."""
    return {name: tuple(published(name, GLUE_DEV + GLUE_TEST)) for name in wanted}


def missing_wanted(wanted: tuple[str, ...] = WANTED_GLUE) -> tuple[str, ...]:
    """The wanted names with no published GLUE row (REFERENCES.md has no figures for them)."""
    return tuple(name for name, rows in wanted_rows(wanted).items() if not rows)
