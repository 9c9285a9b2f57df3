"""A user's own data of every kind, generated from the test vocabulary: files a user would bring.

Each task is learnable from its words, so a tiny model fine-tuned for a few epochs scores
well above chance and every stage has something real to keep or lose:

* text-classification: 4 string labels named after the animal or object a sentence is about;
* multi-label: the set of topics (animal, place, feeling) a sentence mentions;
* regression: the number of "very"/"really" in a sentence;
* token-classification: B-/I- tags on animal and place names inside filler words.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

TOPICS = {"dog": "pets", "cat": "pets", "movie": "films", "film": "films", "paris": "travel", "france": "travel",
          "man": "people", "woman": "people"}
FILLER = "the a of and to in is was it that this on did".split()
ANIMALS = ["dog", "cat"]
PLACES = ["paris", "france", "river", "city"]
FEELINGS = ["love", "hate", "fun", "boring"]


def _sentence(rng: random.Random, keep: list[str]) -> list[str]:
    words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))] + keep
    rng.shuffle(words)
    return words


def classification_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        word = rng.choice(sorted(TOPICS))
        rows.append({"text": " ".join(_sentence(rng, [word])), "category": TOPICS[word]})
    return rows


def multi_label_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        labels, keep = [], []
        for name, words in (("animal", ANIMALS), ("place", PLACES), ("feeling", FEELINGS)):
            if rng.random() < 0.45:
                labels.append(name)
                keep.append(rng.choice(words))
        rows.append({"text": " ".join(_sentence(rng, keep)), "tags": labels})
    return rows


def regression_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(0, 3)
        rows.append({"text": " ".join(_sentence(rng, [rng.choice(["very", "really"]) for _ in range(k)] + ["good"])),
                     "score": float(k)})
    return rows


def ner_sentences(n: int, seed: int = 0) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]
        tags = ["O"] * len(words)
        for kind, names in (("animal", ANIMALS), ("place", PLACES)):
            if rng.random() < 0.7:
                at = rng.randint(0, len(words))
                span = [rng.choice(names)] + (["river"] if kind == "place" and rng.random() < 0.3 else [])
                words[at:at] = span
                tags[at:at] = [f"B-{kind}"] + [f"I-{kind}"] * (len(span) - 1)
        out.append((words, tags))
    return out


def write_csv(path: Path, rows: list[dict], columns: list[str], crlf: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\r\n" if crlf else "\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: (json.dumps(row[c]) if isinstance(row[c], list) else row[c]) for c in columns})
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_conll(path: Path, sentences: list[tuple[list[str], list[str]]], sep: str = "\t") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for words, tags in sentences:
        lines += [f"{w}{sep}{t}" for w, t in zip(words, tags)] + [""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_conll_file(path: Path) -> list[tuple[list[str], list[str]]]:
    """(words, tags) of each sentence of a CoNLL file, read by hand: a line's first and last field, a sentence ended
    by an empty or whitespace-only line (the reference the toolkit's reader and its prediction files are checked by)."""
    sentences, words, tags = [], [], []
    for line in path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n"):
        if not line.strip():
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        words.append(fields[0].strip())
        tags.append(fields[-1].strip())
    if words:
        sentences.append((words, tags))
    return sentences


def own_task_files(root: Path, n_train: int = 160, n_dev: int = 48) -> dict[str, dict[str, Path]]:
    """Train / dev / test files of each kind under ``root``: {kind: {"train": path, "dev": path, "test": path}}."""
    files: dict[str, dict[str, Path]] = {}
    for kind, make, write in (
        ("text-classification", classification_rows, lambda p, r: write_csv(p.with_suffix(".csv"), r, ["text", "category"])),
        ("multi-label", multi_label_rows, lambda p, r: write_jsonl(p.with_suffix(".jsonl"), r)),
        ("regression", regression_rows, lambda p, r: write_csv(p.with_suffix(".csv"), r, ["text", "score"])),
        ("token-classification", ner_sentences, lambda p, r: write_conll(p.with_suffix(".conll"), r)),
    ):
        files[kind] = {split: write(root / kind / split, make(n, seed))
                       for split, n, seed in (("train", n_train, 0), ("dev", n_dev, 1), ("test", n_dev, 2))}
    return files
