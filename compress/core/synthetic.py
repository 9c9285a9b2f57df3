"""A generated sentiment task and corpus, so the toolkit runs with no network and no data.

Sentences are built from templates; the label follows a rule a model has to learn
rather than a single keyword: a review is positive when its adjective is positive,
except that "not" / "never" flips it. Files are written in the GLUE SST-2 layout, so
every command reads them with ``--task sst2 --data-dir DIR``. A reading-comprehension
twin (:func:`write_squad`) asks for the adjective of one noun in a short review.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

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
    root: Path, n_train: int = 2000, n_dev: int = 400, n_test: int = 200, seed: int = 0, label_noise: float = 0.0
) -> Path:
    """Write ``root/SST-2/{train,dev,test}.tsv`` exactly as the GLUE download script lays them out.

    ``label_noise`` flips that fraction of the *training* labels (dev stays clean): a
    teacher that learned the rule then gives better targets than the gold labels, the
    setting where distillation visibly beats training on labels alone.
    """
    folder = Path(root) / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, offset in (("train", n_train, 0), ("dev", n_dev, 1), ("test", n_test, 2)):
        rows = examples(n, seed=seed * 1000 + offset)
        if name == "train" and label_noise:
            flip = random.Random(seed + 99)
            rows = [(text, 1 - label if flip.random() < label_noise else label) for text, label in rows]
        if name == "test":
            lines = ["index\tsentence"] + [f"{i}\t{text}" for i, (text, _) in enumerate(rows)]
        else:
            lines = ["sentence\tlabel"] + [f"{text}\t{label}" for text, label in rows]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Path(root)


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
