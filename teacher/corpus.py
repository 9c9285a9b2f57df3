"""The data side of BERT pretraining: documents -> sentence-pair instances -> masked batches.

A port of google-research/bert ``create_pretraining_data.py`` (Devlin et al. 2019,
section 3.1 and appendix A.1), split where the reference mixes two concerns:

* :func:`build_instances` makes the sentence pairs once (``create_instances_from_document``):
  segment A, segment B, and whether B is the real continuation (NSP).
* :class:`PretrainCollator` turns a batch of instances into tensors and draws the MLM
  masks at training time (``create_masked_lm_predictions``), from a generator seeded by
  ``(seed, step)`` only. The reference fixes the masks when writing the TFRecords
  (``dupe_factor`` copies with different masks); here every step draws its own masks,
  and the same step always draws the same ones, so a resumed run sees exactly the
  batches it would have seen.

Conventions: ``next_sentence_label`` is 0 for IsNext and 1 for NotNext (as in the reference
and ``transformers.BertForPreTraining``); MLM ``labels`` are -100 where nothing is predicted.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch

from compress.core.data.files import read_text_file
from compress.core.errors import CompressError, reason
from compress.core.paths import check_input_file
from compress.core.hub import hub_offline_mode, hub_reachable, offline_as_set_now
from compress.teacher.tokenizer import CONTINUATION

IGNORE_INDEX = -100  # label of positions without an MLM prediction (torch cross-entropy's default)
IS_NEXT, NOT_NEXT = 0, 1
# What happened to a selected token (the reference's 80/10/10 rule).
NONE, MASKED, KEPT, RANDOM = 0, 1, 2, 3
_STAT_COUNTS = (
    "sequences", "maskable", "selected", "special_selected", "mask", "random", "random_same", "kept", "unchanged",
)  # fmt: skip

# A sentence ends after . ! or ? followed by whitespace (lines of a block are joined first).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ENCODE_CHUNK = 10_000  # sentences per batch-encode call: bounds peak memory on big corpora
HUB_PREFIX = "hf:"  # --corpus hf:wikitext:wikitext-103-raw-v1 reads a hub dataset's train split


# ---------------------------------------------------------------------------- documents


def read_documents(paths: str | Path | Iterable[str | Path]) -> list[list[str]]:
    """Read text files or ``datasets`` corpora into documents of sentences (the reference's input format, relaxed).

    The reference wants one sentence per line and blank lines between documents. Here a
    block of lines between blank lines is a document; its lines are joined and split into
    sentences after ``.``, ``!`` or ``?`` followed by whitespace. WikiText headings
    (`` = = Title = = ``) are skipped. A directory stands for all ``*.txt`` files under it;
    a ``datasets`` corpus (see :func:`is_dataset_source`) contributes each row of its text
    column as a document (blank lines inside a row split it further).
    """
    sources = _sources(paths)
    documents: list[list[str]] = []
    for source in sources:
        text = load_dataset_text(source) if isinstance(source, str) else read_text_file(source)
        documents.extend(_split_documents(text))
    if not documents:
        names = ", ".join(str(p) for p in sources[:3]) + (" ..." if len(sources) > 3 else "")
        raise CompressError(f"no text found in {names}; pass a corpus with documents separated by blank lines")
    return documents


def is_dataset_source(path: str | Path) -> bool:
    """``hf:NAME[:CONFIG]`` (a hub dataset's train split) or a folder written by ``datasets``' ``save_to_disk``."""
    if str(path).startswith(HUB_PREFIX):
        return True
    folder = Path(path)
    return folder.is_dir() and any((folder / name).is_file() for name in ("dataset_dict.json", "state.json"))


def load_dataset_text(source: str | Path) -> str:
    """The text column of a ``datasets`` corpus, rows separated by blank lines (each row a document)."""
    # deferred: a heavy import, paid only where it is used
    import datasets

    text = str(source)
    if text.startswith(HUB_PREFIX):
        name, _, config = text[len(HUB_PREFIX):].partition(":")
        hint = "save it with datasets' save_to_disk on a connected machine and pass that folder, or pass text files"
        if not hub_offline_mode() and not hub_reachable():
            raise CompressError(f"cannot download corpus {name}: the Hugging Face hub is unreachable; {hint}")
        try:
            with offline_as_set_now():
                ds = datasets.load_dataset(name, config or None, split="train")
        except Exception as err:  # datasets raises many types; the user needs one line
            raise CompressError(f"cannot load corpus {name} from the Hugging Face hub: {reason(err)}; {hint}") from None
    else:
        ds = datasets.load_from_disk(text)
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise CompressError(f"corpus {text} has splits {', '.join(ds)} and no 'train'; save the split to use")
            ds = ds["train"]
    strings = [name for name, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
    column = "text" if "text" in strings else (strings[0] if len(strings) == 1 else None)
    if column is None:
        raise CompressError(
            f"corpus {text} has no 'text' column and no single string column (columns: {', '.join(ds.column_names)}); "
            "rename the text column to 'text'"
        )
    return "\n\n".join(row for row in ds[column] if row)


def _sources(paths: str | Path | Iterable[str | Path]) -> list[Path | str]:
    """Text files (as paths) and ``datasets`` corpora (as strings), in the order given."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    sources: list[Path | str] = []
    for path in paths:
        if is_dataset_source(path):
            sources.append(str(path))
        else:
            sources.extend(_text_files([path]))
    if not sources:
        raise CompressError("no corpus files given; pass at least one text file or folder")
    return sources


def _text_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """The files to read: each path as given, or the sorted ``*.txt`` files under a directory."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.txt") if p.is_file())
            if not found:
                raise CompressError(f"corpus directory {path} has no *.txt files; pass text files or a folder of them")
            files.extend(found)
        else:
            files.append(check_input_file(path, "corpus file"))  # missing, a FIFO, a device, empty: said as such
    if not files:
        raise CompressError("no corpus files given; pass at least one text file or folder")
    return files


def _split_documents(text: str) -> list[list[str]]:
    """Blank lines separate documents; each document becomes its non-empty sentences.

    Lines inside a block are joined before splitting at sentence ends, so prose wrapped
    at a fixed width (Project Gutenberg) keeps whole sentences; one-sentence-per-line
    files split the same way since their lines end with punctuation.
    """
    documents: list[list[str]] = []
    current: list[str] = []

    def close() -> None:
        block = " ".join(current)
        sentences = [s for s in (p.strip() for p in _SENTENCE_END.split(block)) if s]
        if sentences:
            documents.append(sentences)
        current.clear()

    for line in text.splitlines():
        line = line.strip()
        if not line:
            close()
        elif not _is_heading(line):
            current.append(line)
    close()
    return documents


def _is_heading(line: str) -> bool:
    """WikiText section titles look like ``= Title =`` or ``= = Sub = =``."""
    return len(line) >= 2 and line.startswith("=") and line.endswith("=")


def tokenize_documents(documents: Sequence[Sequence[str]], tokenizer) -> list[list[list[int]]]:
    """Token ids of every sentence, without special tokens, batch-encoded by the fast tokenizer.

    Sentences with no tokens are dropped (as the reference does); documents keep their
    positions, so ``result[i]`` belongs to ``documents[i]`` (possibly empty).
    """
    flat = [sentence for doc in documents for sentence in doc]
    encoded: list[list[int]] = []
    for start in range(0, len(flat), _ENCODE_CHUNK):
        # verbose=False: long sentences are fine here, build_instances truncates pairs.
        encoded.extend(
            tokenizer(
                flat[start : start + _ENCODE_CHUNK],
                add_special_tokens=False,
                return_attention_mask=False,
                return_token_type_ids=False,
                verbose=False,
            )["input_ids"]
        )
    result, k = [], 0
    for doc in documents:
        result.append([ids for ids in encoded[k : k + len(doc)] if ids])
        k += len(doc)
    return result


# ---------------------------------------------------------------------------- instances (NSP)


@dataclass(frozen=True)
class Instance:
    """One sentence pair: ``[CLS] tokens_a [SEP] tokens_b [SEP]`` before masking."""

    tokens_a: tuple[int, ...]  # segment A: whole sentences from one document
    tokens_b: tuple[int, ...]  # segment B: A's continuation, or sentences of another document
    is_random_next: bool  # True when B comes from another document (NSP label NotNext)


def build_instances(
    docs_ids: Sequence[Sequence[Sequence[int]]],
    max_length: int,
    seed: int,
    *,
    short_seq_prob: float = 0.1,
    nsp_probability: float = 0.5,
    dupe_factor: int = 1,
) -> list[Instance]:
    """Make NSP sentence pairs from tokenised documents (create_pretraining_data.py,
    ``create_training_instances`` + ``create_instances_from_document``).

    ``docs_ids[d][s]`` is the token ids of sentence ``s`` of document ``d``. Every pair fits
    ``max_length`` with its three special tokens. Documents are shuffled and the instances
    shuffled at the end, with one ``random.Random(seed)``, as in the reference. One
    deliberate differences: a random B always comes from another document (the reference
    gives up after 10 draws of the same document), and a chunk of one sentence is cut in
    two so the NSP coin still decides (the reference forces NotNext, which skews the 50/50
    split on corpora of short documents).
    """
    if max_length < 5:
        raise CompressError(f"max_length must be at least 5 ([CLS] A [SEP] B [SEP] with 2 tokens), got {max_length}")
    for name, value in (("short_seq_prob", short_seq_prob), ("nsp_probability", nsp_probability)):
        if not 0.0 <= value <= 1.0:
            raise CompressError(f"{name} must be between 0 and 1, got {value}")
    if dupe_factor < 1:
        raise CompressError(f"dupe_factor must be at least 1, got {dupe_factor}")
    rng = random.Random(seed)
    documents = [[list(s) for s in doc if len(s)] for doc in docs_ids]
    documents = [doc for doc in documents if doc]
    if len(documents) < 2:
        raise CompressError(
            f"next-sentence prediction needs at least 2 documents with text, found {len(documents)}; "
            "separate documents in the corpus with blank lines"
        )
    rng.shuffle(documents)
    instances: list[Instance] = []
    for _ in range(dupe_factor):
        for index in range(len(documents)):
            instances.extend(
                _instances_from_document(documents, index, max_length, short_seq_prob, nsp_probability, rng)
            )
    rng.shuffle(instances)
    return instances


def _instances_from_document(
    documents: list[list[list[int]]],
    index: int,
    max_length: int,
    short_seq_prob: float,
    nsp_probability: float,
    rng: random.Random,
) -> list[Instance]:
    """Pairs from one document (a line-by-line port of ``create_instances_from_document``)."""
    document = documents[index]
    max_num_tokens = max_length - 3  # room for [CLS], [SEP], [SEP]
    # Usually fill the sequence; sometimes (short_seq_prob) aim shorter, to look like fine-tuning inputs.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances: list[Instance] = []
    chunk: list[list[int]] = []  # whole sentences, so A/B split at real sentence boundaries
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            chunk_was_split = len(chunk) == 1 and len(chunk[0]) >= 2
            if chunk_was_split:
                # A one-sentence chunk would force NotNext (the reference's behaviour), which
                # skews NSP towards NotNext on corpora of short documents. The paper's
                # "sentences" are arbitrary spans of contiguous text, so split it in two
                # and let the coin decide, keeping IsNext/NotNext at 50/50.
                cut = rng.randint(1, len(chunk[0]) - 1)
                chunk = [chunk[0][:cut], chunk[0][cut:]]
            # a_end: how many of the chunk's segments go into A.
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
            if len(chunk) == 1 or rng.random() < nsp_probability:
                is_random_next = True
                tokens_b = _random_continuation(documents, index, target_seq_length - len(tokens_a), rng)
                # B did not use the chunk's remaining sentences: "put them back" for the next
                # chunk (a split single sentence has nothing to put back: it is used up).
                i -= max(0, len(chunk) - a_end - (1 if chunk_was_split else 0))
            else:
                is_random_next = False
                tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            instances.append(Instance(tuple(tokens_a), tuple(tokens_b), is_random_next))
            chunk, chunk_length = [], 0
        i += 1
    return instances


def _random_continuation(
    documents: list[list[list[int]]], index: int, target_length: int, rng: random.Random
) -> list[int]:
    """Sentences of another document, from a random sentence on, until ``target_length`` tokens."""
    other = rng.randint(0, len(documents) - 2)
    other += other >= index  # skip the current document: uniform over the others
    document = documents[other]
    tokens: list[int] = []
    for sentence in document[rng.randint(0, len(document) - 1) :]:
        tokens.extend(sentence)
        if len(tokens) >= target_length:
            break
    return tokens


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer segment, from the front or the back at random, until the pair fits
    (create_pretraining_data.py ``truncate_seq_pair``; in place)."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        # Both ends, so neither the start nor the end of sentences is systematically lost.
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


# ---------------------------------------------------------------------------- masking (MLM)


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    maskable: torch.Tensor,
    word_start: torch.Tensor,
    mask_token_id: int,
    random_token_ids: torch.Tensor,
    generator: torch.Generator,
    mlm_probability: float = 0.15,
    whole_word: bool = False,
    max_predictions: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose MLM targets and corrupt them 80/10/10 (BERT paper 3.1; ``create_masked_lm_predictions``).

    Per sequence exactly ``min(max_predictions, max(1, round(n * mlm_probability)))`` of
    its ``n`` maskable tokens are selected (the reference counts [CLS]/[SEP] in ``n``;
    here only maskable tokens count, so the rate is 15% of the text). With
    ``whole_word``, whole words (a start piece and its ``##`` pieces) are chosen in
    random order and a word that would overshoot the budget is skipped. Each selected
    token becomes [MASK] with probability 0.8, a uniform draw from ``random_token_ids``
    with 0.1 (which can be the original token), and stays as it is with 0.1.

    Shapes: ``input_ids``, ``maskable``, ``word_start`` (batch, seq). Returns new
    ``(masked_input_ids, labels)``, labels = original id where selected, -100 elsewhere.
    """
    masked, labels, _ = _mask_with_actions(
        input_ids, maskable=maskable, word_start=word_start, mask_token_id=mask_token_id,
        random_token_ids=random_token_ids, generator=generator, mlm_probability=mlm_probability,
        whole_word=whole_word, max_predictions=max_predictions,
    )  # fmt: skip
    return masked, labels


def _mask_with_actions(
    input_ids: torch.Tensor,
    *,
    maskable: torch.Tensor,
    word_start: torch.Tensor,
    mask_token_id: int,
    random_token_ids: torch.Tensor,
    generator: torch.Generator,
    mlm_probability: float,
    whole_word: bool,
    max_predictions: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`mask_tokens` plus what happened to each token (NONE/MASKED/KEPT/RANDOM), for statistics."""
    if not 0.0 < mlm_probability <= 1.0:
        raise CompressError(f"mlm_probability must be in (0, 1], got {mlm_probability}")
    if max_predictions is not None and max_predictions < 1:
        raise CompressError(f"max_predictions must be at least 1 (or None for no cap), got {max_predictions}")
    if len(random_token_ids) == 0:
        raise CompressError("the vocabulary has no ordinary tokens to draw random replacements from")
    maskable = maskable.bool()
    budget = _budget(maskable.sum(dim=1), mlm_probability, max_predictions)  # (batch,)
    if whole_word:
        selected = _select_whole_words(maskable, word_start.bool(), budget, generator)
    else:
        selected = _select_tokens(maskable, budget, generator)  # (batch, seq) bool

    # One uniform per position: [0, .8) -> [MASK], [.8, .9) -> keep, [.9, 1) -> random,
    # the reference's "random() < 0.8, else random() < 0.5 keeps" with one draw.
    u = torch.rand(input_ids.shape, generator=generator)  # (batch, seq)
    actions = torch.full(input_ids.shape, NONE, dtype=torch.int8)
    actions[selected & (u < 0.8)] = MASKED
    actions[selected & (u >= 0.8) & (u < 0.9)] = KEPT
    actions[selected & (u >= 0.9)] = RANDOM
    draws = torch.randint(len(random_token_ids), input_ids.shape, generator=generator)  # (batch, seq)
    random_ids = random_token_ids.to(input_ids.dtype)[draws]

    masked = input_ids.clone()  # never touch the caller's tensor
    masked[actions == MASKED] = mask_token_id
    masked = torch.where(actions == RANDOM, random_ids, masked)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return masked, labels, actions


def _budget(n_maskable: torch.Tensor, mlm_probability: float, max_predictions: int | None) -> torch.Tensor:
    """Tokens to predict per sequence: the reference's ``min(cap, max(1, round(n * p)))``, never above n."""
    cap = max_predictions if max_predictions is not None else math.inf
    return torch.tensor([int(min(cap, n, max(1, round(n * mlm_probability)))) for n in n_maskable.tolist()])


def _select_tokens(maskable: torch.Tensor, budget: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random subset of exactly ``budget[b]`` maskable positions per row."""
    batch, seq = maskable.shape
    # Random scores, maskable first: a row's first budget[b] positions in score order are a
    # uniform sample without replacement (the reference shuffles candidates and takes a prefix).
    scores = torch.rand((batch, seq), generator=generator).masked_fill(~maskable, 2.0)  # (batch, seq)
    order = scores.argsort(dim=1)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(seq).expand(batch, seq))  # (batch, seq)
    return (rank < budget[:, None]) & maskable


def _select_whole_words(
    maskable: torch.Tensor, word_start: torch.Tensor, budget: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Whole words in random order until the budget is met, skipping a word that would overshoot
    (the reference's ``do_whole_word_mask`` branch)."""
    selected = torch.zeros_like(maskable)
    for row in range(maskable.shape[0]):
        units = _word_units(maskable[row].tolist(), word_start[row].tolist())
        want, chosen = int(budget[row]), []
        for k in torch.randperm(len(units), generator=generator).tolist():
            if len(chosen) >= want:
                break
            if len(chosen) + len(units[k]) <= want:
                chosen.extend(units[k])
        selected[row, chosen] = True
    return selected


def _word_units(maskable: list[bool], word_start: list[bool]) -> list[list[int]]:
    """Positions grouped into words: a start piece plus the ``##`` pieces after it.

    A continuation piece right after a special token (B cut at the front by truncation)
    starts its own unit, so a word never spans [SEP].
    """
    units: list[list[int]] = []
    previous_maskable = False
    for pos, (ok, start) in enumerate(zip(maskable, word_start)):
        if ok and (start or not previous_maskable):
            units.append([pos])
        elif ok:
            units[-1].append(pos)
        previous_maskable = ok
    return units


# ---------------------------------------------------------------------------- collator


class PretrainCollator:
    """Batch instances as ``[CLS] A [SEP] B [SEP]`` with MLM masks and NSP labels.

    Returns ``input_ids``, ``token_type_ids``, ``attention_mask``, ``labels`` (batch, seq)
    and ``next_sentence_label`` (batch,), right-padded with [PAD] to the longest pair: the
    keyword arguments of ``transformers.BertForPreTraining``. The masks depend on
    ``(seed, step)`` only, never on the global RNG.
    """

    def __init__(
        self,
        tokenizer,
        *,
        mlm_probability: float = 0.15,
        whole_word: bool = False,
        seed: int = 0,
        max_predictions: int | None = None,
    ):
        self.mlm_probability = mlm_probability
        self.whole_word = whole_word
        self.seed = seed
        self.max_predictions = max_predictions
        self.cls_id, self.sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        self.pad_id, self.mask_id = tokenizer.pad_token_id, tokenizer.mask_token_id
        if None in (self.cls_id, self.sep_id, self.pad_id, self.mask_id):
            raise CompressError(
                "the tokenizer lacks one of [CLS], [SEP], [PAD], [MASK]; use a BERT WordPiece tokenizer"
            )
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self._continues = torch.tensor([t.startswith(CONTINUATION) for t in tokens])  # (vocab,) bool
        special = set(tokenizer.all_special_ids)
        # Random replacements are ordinary tokens only (the reference draws from the whole vocab).
        self.random_token_ids = torch.tensor([i for i in range(len(tokens)) if i not in special], dtype=torch.long)

    def __call__(self, instances: Sequence[Instance], step: int) -> dict[str, torch.Tensor]:
        """The model inputs for ``instances`` at training step ``step``."""
        batch, _, _ = self._collate(instances, step)
        return batch

    def _collate(self, instances: Sequence[Instance], step: int):
        """Batch plus the maskable positions and masking actions, for :func:`masking_stats`."""
        if not instances:
            raise CompressError("cannot collate an empty batch of instances")
        input_ids, token_type_ids, maskable, lengths = self._layout(instances)
        attention_mask = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long()  # (batch, seq)
        masked, labels, actions = _mask_with_actions(
            input_ids, maskable=maskable, word_start=~self._continues[input_ids], mask_token_id=self.mask_id,
            random_token_ids=self.random_token_ids, generator=step_generator(self.seed, step),
            mlm_probability=self.mlm_probability, whole_word=self.whole_word, max_predictions=self.max_predictions,
        )  # fmt: skip
        batch = {
            "input_ids": masked,
            "token_type_ids": token_type_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "next_sentence_label": torch.tensor([NOT_NEXT if x.is_random_next else IS_NEXT for x in instances]),
        }
        return batch, maskable, actions

    def _layout(self, instances: Sequence[Instance]):
        """Ids, segment ids and maskable flags of ``[CLS] A [SEP] B [SEP] [PAD]...``, (batch, seq) each."""
        width = max(len(x.tokens_a) + len(x.tokens_b) + 3 for x in instances)
        ids, types, maskable, lengths = [], [], [], []
        for x in instances:
            na, nb = len(x.tokens_a), len(x.tokens_b)
            pad = width - (na + nb + 3)
            ids.append([self.cls_id, *x.tokens_a, self.sep_id, *x.tokens_b, self.sep_id] + [self.pad_id] * pad)
            types.append([0] * (na + 2) + [1] * (nb + 1) + [0] * pad)  # 0 through the first [SEP]
            # Special tokens and padding are never predicted; [UNK] is, as in the reference.
            maskable.append([False] + [True] * na + [False] + [True] * nb + [False] * (pad + 1))
            lengths.append(na + nb + 3)
        as_long = lambda rows: torch.tensor(rows, dtype=torch.long)  # noqa: E731
        return as_long(ids), as_long(types), torch.tensor(maskable), as_long(lengths)


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator determined by ``(seed, step)`` alone, well mixed so nearby pairs differ."""
    digest = hashlib.blake2b(f"{seed}/{step}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


# ---------------------------------------------------------------------------- statistics


def masking_stats(
    tokenizer,
    instances: Sequence[Instance],
    *,
    mlm_probability: float = 0.15,
    whole_word: bool = False,
    seed: int = 0,
    batch_size: int = 64,
) -> dict:
    """Count what the collator does to ``instances``: selection rate and the 80/10/10 split.

    Counts: ``maskable`` tokens, ``selected`` ones, and among those ``mask`` ([MASK]),
    ``random`` (a random token different from the original), ``random_same`` (a random draw
    that hit the original token, so it looks unchanged), ``kept`` (left unchanged by
    choice) and ``unchanged`` (input equals label: ``kept + random_same``);
    ``special_selected`` counts selected [CLS]/[SEP]/[PAD] positions and must be 0.
    Fractions: ``selected_fraction`` = selected/maskable; ``mask_fraction``,
    ``random_fraction`` (decided random, same token included), ``kept_fraction`` and
    ``unchanged_fraction`` are over selected.
    """
    collator = PretrainCollator(tokenizer, mlm_probability=mlm_probability, whole_word=whole_word, seed=seed)
    if not instances:
        raise CompressError("no instances to measure; build some with build_instances first")
    counts: Counter = Counter(dict.fromkeys(_STAT_COUNTS, 0))
    for step, start in enumerate(range(0, len(instances), batch_size)):
        batch, maskable, actions = collator._collate(instances[start : start + batch_size], step)
        inputs, labels = batch["input_ids"], batch["labels"]
        selected = labels != IGNORE_INDEX  # (batch, seq)
        same = inputs == labels
        counts["sequences"] += len(inputs)
        counts["maskable"] += int(maskable.sum())
        counts["selected"] += int(selected.sum())
        counts["special_selected"] += int((selected & ~maskable).sum())
        counts["mask"] += int((selected & (inputs == collator.mask_id)).sum())
        counts["random"] += int((selected & ~same & (inputs != collator.mask_id)).sum())
        counts["random_same"] += int(((actions == RANDOM) & same).sum())
        counts["kept"] += int((actions == KEPT).sum())
        counts["unchanged"] += int((selected & same).sum())
    stats = dict(counts)
    selected = max(stats["selected"], 1)
    stats["selected_fraction"] = stats["selected"] / max(stats["maskable"], 1)
    stats["mask_fraction"] = stats["mask"] / selected
    stats["random_fraction"] = (stats["random"] + stats["random_same"]) / selected
    stats["kept_fraction"] = stats["kept"] / selected
    stats["unchanged_fraction"] = stats["unchanged"] / selected
    return stats
