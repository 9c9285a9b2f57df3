"""A generated sentiment task and corpus, so the toolkit runs with no network and no data.

Sentences are built from templates; the label follows a rule a model has to learn
rather than a single keyword: a review is positive when its adjective is positive,
except that "not" / "never" flips it. Files are written in the GLUE SST-2 layout, so
every command reads them with ``--task sst2 --data-dir DIR``. A reading-comprehension
twin (:func:`write_squad`) asks for the adjective of one noun in a short review.

That task is easy: a pretrained encoder scores 100% on it, its students too. :class:`HardTask`
(``write_sst2_layout(..., hard=HardTask())``, what ``compress demo`` trains on) keeps the
rule but draws reviews a small model learns worse: contrast clauses (the main clause
decides), negations that stand away from the adjective or cancel in pairs, a long tail of
adjectives of which some never appear in training, and gold labels flipped at a stated rate
in every labelled split. :func:`rule_label` reads the rule back from a review's words.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from compress.core.errors import CompressError

POSITIVE = ("good", "great", "wonderful", "charming", "brilliant", "moving", "funny", "clever", "warm", "fresh")
NEGATIVE = ("bad", "awful", "boring", "dull", "clumsy", "tedious", "weak", "silly", "flat", "stale")
NOUNS = ("movie", "film", "story", "plot", "script", "cast", "ending", "score", "director", "performance")
INTENSIFIERS = ("very", "really", "truly", "quite", "rather", "so")
NEGATIONS = ("not", "never")
TEMPLATES = (
    "the {noun} is {neg}{adv}{adj} .",
    "this {noun} was {neg}{adv}{adj} .",
    "i found the {noun} {neg}{adv}{adj} .",
    "a {neg}{adv}{adj} {noun} , overall .",
    "what a {neg}{adv}{adj} {noun} !",
    "the {noun} and the {noun2} are {neg}{adv}{adj} .",
)
FILLER = ("the", "a", "is", "was", "this", "i", "found", "and", "are", "what", "overall", ".", ",", "!")
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def sentence(rng: random.Random) -> tuple[str, int]:
    """One templated review and its label (1 = positive)."""
    positive = rng.random() < 0.5
    negated = rng.random() < 0.3
    adj = rng.choice(POSITIVE if positive else NEGATIVE)
    nouns = rng.sample(NOUNS, 2)
    text = rng.choice(TEMPLATES).format(
        noun=nouns[0],
        noun2=nouns[1],
        adj=adj,
        adv=(rng.choice(INTENSIFIERS) + " ") if rng.random() < 0.4 else "",
        neg=(rng.choice(NEGATIONS) + " ") if negated else "",
    )
    return text, int(positive != negated)


def examples(n: int, seed: int = 0) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [sentence(rng) for _ in range(n)]


def vocabulary() -> list[str]:
    """Every word the generator can emit, after the BERT special tokens."""
    words = dict.fromkeys(FILLER + POSITIVE + NEGATIVE + NOUNS + INTENSIFIERS + NEGATIONS)
    return list(SPECIAL_TOKENS) + list(words)


def write_vocab(path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(vocabulary()) + "\n", encoding="utf-8")
    return path


def write_sst2_layout(
    root: Path, *, n_train: int = 2000, n_dev: int = 400, n_test: int = 200, seed: int = 0, label_noise: float = 0.0,
    hard: HardTask | None = None,
) -> Path:
    """Write ``root/SST-2/{train,dev,test}.tsv`` exactly as the GLUE download script lays them out.

    ``label_noise`` flips that fraction of the *training* labels (dev stays clean): a
    teacher that learned the rule then gives better targets than the gold labels, the
    setting where distillation visibly beats training on labels alone. ``hard`` draws the
    reviews of :class:`HardTask` instead (its own noise applies to train and dev alike).
    """
    folder = Path(root) / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, offset in (("train", n_train, 0), ("dev", n_dev, 1), ("test", n_test, 2)):
        split_seed = seed * 1000 + offset
        rows = examples(n, seed=split_seed) if hard is None else hard_examples(n, split_seed, hard, train=name == "train")
        if name == "train" and label_noise:
            flip = random.Random(seed + 99)
            rows = [(text, 1 - label if flip.random() < label_noise else label) for text, label in rows]
        if name == "test":
            lines = ["index\tsentence"] + [f"{i}\t{text}" for i, (text, _) in enumerate(rows)]
        else:
            lines = ["sentence\tlabel"] + [f"{text}\t{label}" for text, label in rows]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Path(root)


# ---------------------------------------------------------------------------- the harder task (compress demo)

# The long tail: adjectives beyond the ten frequent ones of each polarity, drawn as often as ``HardTask.tail`` says.
# Every ``HardTask.held_out``-th of them never appears in training, only in dev and test, as real test sets hold words
# their training sets lack: a model can only get those right from what its encoder knew before fine-tuning.
POSITIVE_TAIL = ("superb", "delightful", "gripping", "touching", "witty", "stunning", "heartfelt", "inventive",
                 "engaging", "masterful", "dazzling", "poignant", "lovely", "excellent", "memorable", "riveting",
                 "beautiful", "hilarious", "thoughtful", "splendid", "terrific", "enchanting", "absorbing", "elegant",
                 "vibrant", "powerful", "exhilarating", "satisfying", "magnificent", "marvelous")
NEGATIVE_TAIL = ("dreadful", "terrible", "lifeless", "tiresome", "bland", "pointless", "mediocre", "clunky",
                 "shallow", "forgettable", "lame", "dreary", "sluggish", "pretentious", "muddled", "insipid", "tepid",
                 "awkward", "messy", "predictable", "painful", "horrible", "incoherent", "plodding", "lazy", "hollow",
                 "bloated", "annoying", "contrived", "ugly")
POLARITY = {**dict.fromkeys(POSITIVE + POSITIVE_TAIL, 1), **dict.fromkeys(NEGATIVE + NEGATIVE_TAIL, 0)}
# Words that negate the clause they are in; an even number of them cancels ("never not good" is good).
CLAUSE_NEGATIONS = ("not", "never", "no")
# Clauses by their number of negations. The single ones include negations far from the adjective ("it is not true
# that ..."), the double ones pairs that cancel: both are rarer than plain clauses and harder for a shallow model.
CLAUSES = (
    ("the {noun} is {adv}{adj}", "this {noun} was {adv}{adj}", "i found the {noun} {adv}{adj}",
     "the {noun} felt {adv}{adj}"),
    ("the {noun} is {neg} {adv}{adj}", "this {noun} was {neg} {adv}{adj}", "i found the {noun} not {adv}{adj}",
     "it is not true that the {noun} is {adv}{adj}", "no one would call the {noun} {adv}{adj}"),
    ("the {noun} is never not {adv}{adj}", "it is not true that the {noun} is not {adv}{adj}",
     "no one would say the {noun} was not {adv}{adj}", "i never found the {noun} not {adv}{adj}"),
)


@dataclass(frozen=True)
class HardTask:
    """How the reviews of the harder task are drawn (the rule itself is :func:`rule_label`'s)."""

    label_noise: float = 0.05  # gold labels flipped in every labelled split (annotators disagree): ~95% is the ceiling
    contrast: float = 0.35  # two-clause reviews of opposite meaning, "A , but B" / "although A , B" / "B , although A"
    negation: float = 0.25  # clauses with one negation
    double_negation: float = 0.12  # clauses with two, which cancel
    tail: float = 0.4  # adjectives drawn from the long tail instead of the ten frequent ones of their polarity
    held_out: int = 3  # every held_out-th tail adjective never appears in training (0: none held out)

    def validate(self) -> None:
        for name in ("label_noise", "contrast", "negation", "double_negation", "tail"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise CompressError(f"HardTask.{name} must be between 0 and 1, got {getattr(self, name)}")
        if self.negation + self.double_negation > 1.0:
            raise CompressError(f"HardTask.negation + double_negation must be at most 1, got {self.negation + self.double_negation}")
        if self.held_out < 0:
            raise CompressError(f"HardTask.held_out must be 0 or more, got {self.held_out}")


def held_out_adjectives(task: HardTask) -> frozenset[str]:
    """The tail adjectives that training never shows (dev and test do)."""
    if task.held_out == 0:
        return frozenset()
    return frozenset(w for tail in (POSITIVE_TAIL, NEGATIVE_TAIL) for i, w in enumerate(tail) if i % task.held_out == task.held_out - 1)


def _adjective(rng: random.Random, task: HardTask, positive: bool, train: bool) -> str:
    head, tail = (POSITIVE, POSITIVE_TAIL) if positive else (NEGATIVE, NEGATIVE_TAIL)
    if rng.random() >= task.tail:
        return rng.choice(head)
    unseen = held_out_adjectives(task) if train else frozenset()
    return rng.choice([w for w in tail if w not in unseen])


def _clause(rng: random.Random, task: HardTask, meaning: int, train: bool) -> str:
    """A clause that means ``meaning`` (1 = positive): its adjective's polarity, flipped by an odd number of negations."""
    draw = rng.random()
    negations = 2 if draw < task.double_negation else 1 if draw < task.double_negation + task.negation else 0
    adj = _adjective(rng, task, positive=(meaning == 1) != (negations % 2 == 1), train=train)
    adv = (rng.choice(INTENSIFIERS) + " ") if rng.random() < 0.3 else ""
    return rng.choice(CLAUSES[negations]).format(noun=rng.choice(NOUNS), adj=adj, adv=adv, neg=rng.choice(NEGATIONS))


def hard_review(rng: random.Random, task: HardTask, train: bool = False) -> tuple[str, int]:
    """One review of the harder task and its rule label (before any noise); ``train`` leaves out the held-out words."""
    label = int(rng.random() < 0.5)
    main = _clause(rng, task, label, train)
    if rng.random() >= task.contrast:
        return f"{main} {rng.choice(('.', '!'))}", label
    # The other clause means the opposite, so counting words cannot tell the label: only which clause is the main one.
    other = _clause(rng, task, 1 - label, train)
    form = rng.randrange(3)
    text = (f"{other} , but {main} ." if form == 0 else f"although {other} , {main} ." if form == 1
            else f"{main} , although {other} .")
    return text, label


def hard_examples(n: int, seed: int = 0, task: HardTask = HardTask(), *, train: bool = False) -> list[tuple[str, int]]:
    """``n`` reviews of the harder task with their gold labels: the rule's, flipped at ``task.label_noise``.

    The flips are drawn from their own stream, so the texts of a seed do not depend on the noise rate.
    """
    task.validate()
    rng, flips = random.Random(seed), random.Random(f"label-noise-{seed}")
    rows = [hard_review(rng, task, train) for _ in range(n)]
    return [(text, 1 - label if flips.random() < task.label_noise else label) for text, label in rows]


def decisive_clause(text: str) -> str:
    """The clause of a review of the harder task that its label follows: the main one of a contrast."""
    if text.startswith("although "):
        return text.split(" , ", 1)[1]
    if " , but " in text:
        return text.split(" , but ", 1)[1]
    return text.split(" , although ", 1)[0]


def rule_label(text: str) -> int:
    """The label the harder task's rule gives a review, read from its words (1 = positive).

    The decisive clause's adjective's polarity, flipped when the clause holds an odd number
    of negations. Independent of the generator, so a test can check the generator against it.
    """
    words = decisive_clause(text).split()
    adjectives = [w for w in words if w in POLARITY]
    if len(adjectives) != 1:
        raise CompressError(f"not a review of the generated task (decisive clause has {len(adjectives)} adjectives): {text!r}")
    return int((POLARITY[adjectives[0]] == 1) != (sum(w in CLAUSE_NEGATIONS for w in words) % 2 == 1))


def squad_paragraph(rng: random.Random, qid: str, no_answer: bool = False) -> dict:
    """A review of two or three nouns and one question, ``which is good ?`` or ``which is bad ?``.

    Exactly one adjective of the asked polarity is in the review, the others have the
    opposite one, so the answer is that adjective: the model must read both the question
    and the words. With ``no_answer`` every adjective has the opposite polarity (v2.0).
    """
    good = rng.random() < 0.5
    asked, other = (POSITIVE, NEGATIVE) if good else (NEGATIVE, POSITIVE)
    nouns = rng.sample(NOUNS, rng.choice((2, 3)))
    target = None if no_answer else rng.randrange(len(nouns))
    context, answers = "", []
    for i, noun in enumerate(nouns):
        lead = f"the {noun} is " + (rng.choice(INTENSIFIERS) + " " if rng.random() < 0.3 else "")
        context += " " if context else ""
        adj = rng.choice(asked if i == target else other)
        if i == target:
            answers.append({"text": adj, "answer_start": len(context) + len(lead)})  # character offset
        context += lead + adj + " ."
    question = f"which is {'good' if good else 'bad'} ?"
    return {"context": context, "qas": [{"id": qid, "question": question, "answers": answers, "is_impossible": no_answer}]}


def write_squad(path: Path, n: int, seed: int = 0, *, version: str = "1.1", no_answer_fraction: float = 0.0) -> Path:
    """Write a SQuAD-format JSON file (``version`` 1.1 or 2.0) of ``n`` generated questions."""
    rng = random.Random(seed)
    paragraphs = [squad_paragraph(rng, f"q{seed}-{i}", no_answer=version != "1.1" and rng.random() < no_answer_fraction)
                  for i in range(n)]
    if version == "1.1":
        for p in paragraphs:
            del p["qas"][0]["is_impossible"]
    doc = {"version": version if version == "1.1" else "v2.0", "data": [{"title": "reviews", "paragraphs": paragraphs}]}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path
