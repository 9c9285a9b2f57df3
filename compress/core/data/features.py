"""Tokenising task data for a model: sentence features, SQuAD windows, word-piece tags, and the batch collator.

Nothing is padded here: :func:`collate` pads each batch to its longest sequence. Each kind of task
is tokenised its own way (text fields and a label; question/context windows over long contexts;
words with a tag each), chosen in this module's one table by the kind's layout (``TaskKind.layout``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from compress.core.errors import CompressError
from compress.core.lazy import load
from compress.core.data.config import check_max_length  # noqa: F401  (the stages read it from here)
from compress.core.data.tasks import Task
from compress.core.data.token_data import check_fast, token_features

log = logging.getLogger(__name__)


def tokenize_classification(ds, task: Task, tokenizer, max_length: int = 128):
    """Tokenise single sentences or pairs (no padding: :func:`collate` pads each batch).

    Adds ``input_ids``, ``token_type_ids``, ``attention_mask`` and ``labels``; keeps ``idx``.
    """
    fields = task.text_fields
    truncated = [0]

    def encode(batch):
        texts = [batch[f] for f in fields]
        enc = tokenizer(*texts, truncation=True, max_length=max_length)
        # A fast tokenizer keeps what it cut in each encoding's ``overflowing``: counted, never silent.
        truncated[0] += sum(1 for e in (getattr(enc, "encodings", None) or []) if e.overflowing)
        enc["labels"] = batch["label"]
        return enc

    drop = [c for c in ds.column_names if c != "idx"]
    features = ds.map(encode, batched=True, remove_columns=drop, desc=f"tokenising {task.display}")
    if truncated[0]:
        log.info("%s: %d of %d examples are longer than --max-length %d tokens and were truncated",
                 task.display, truncated[0], len(ds), max_length)
    return features


def collate(tokenizer, task: Task | None = None, pad_to_multiple_of: int | None = None):
    """A collator that pads each batch to its longest sequence (dynamic padding); per-token labels pad with -100."""
    # transformers' collators are loaded here: reading and checking a task's data (sources) imports no transformers
    if task is not None and task.behaviour.tagged_words:
        return load("transformers:DataCollatorForTokenClassification")(tokenizer, pad_to_multiple_of=pad_to_multiple_of)
    return load("transformers:DataCollatorWithPadding")(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def squad_train_features(ds, tokenizer, max_length: int = 384, doc_stride: int = 128):
    """SQuAD training features: windows over long contexts with start/end token positions.

    A window that does not contain the answer (and every v2.0 no-answer question)
    points both positions at [CLS] (index 0), as in the BERT paper's SQuAD 2.0 setup.
    An example whose answer text is not at its ``answer_start`` is dropped (with a warning):
    it would teach "no answer"; when no example's answer is found the data is refused.
    """
    _check_stride(max_length, doc_stride)
    ds = _drop_lost_answers(ds)

    def encode(batch):
        enc = _squad_windows(batch, tokenizer, max_length, doc_stride)
        sample_map = enc.pop("overflow_to_sample_mapping")
        starts, ends = [], []
        for i, offsets in enumerate(enc.pop("offset_mapping")):
            seq_ids = enc.sequence_ids(i)
            answers = batch["answers"][sample_map[i]]
            if not answers["answer_start"]:
                starts.append(0)
                ends.append(0)
                continue
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            ctx_start = seq_ids.index(1)
            ctx_end = len(seq_ids) - 1 - seq_ids[::-1].index(1)
            if offsets[ctx_start][0] > start_char or offsets[ctx_end][1] < end_char:
                starts.append(0)
                ends.append(0)
                continue
            s = ctx_start
            while s <= ctx_end and offsets[s][0] <= start_char:
                s += 1
            e = ctx_end
            while e >= ctx_start and offsets[e][1] >= end_char:
                e -= 1
            starts.append(s - 1)
            ends.append(e + 1)
        enc["start_positions"] = starts
        enc["end_positions"] = ends
        return enc

    return ds.map(encode, batched=True, remove_columns=ds.column_names, desc="SQuAD train features")


def _answer_found(context: str, answers) -> bool:
    """Whether the first answer's text is in ``context`` at its ``answer_start`` (whitespace may differ)."""
    if not answers["text"]:
        return False
    start, text = answers["answer_start"][0], answers["text"][0]
    span = context[start : start + len(text)] if 0 <= start < len(context) else ""
    return bool(text.strip()) and " ".join(span.split()) == " ".join(text.split())


def _drop_lost_answers(ds):
    """``ds`` without the examples whose answer is not where it says it is; none may be left with one.

    Training reads only the first answer (its character offset into the context); v2.0
    questions without an answer are kept.
    """
    answers = list(ds["answers"])  # datasets 5 columns are not lists
    answered = [i for i, a in enumerate(answers) if a["answer_start"]]
    if not answered:
        return ds
    contexts = list(ds["context"])
    lost = {i for i in answered if not _answer_found(contexts[i], answers[i])}
    if not lost:
        return ds
    if len(lost) == len(answered):
        raise CompressError(
            f"no SQuAD training example has its answer in its context: in all {len(lost)} answered examples the "
            "answer text is not at answer_start; answer_start must be the 0-based character offset of the text in context"
        )
    log.warning(
        "dropped %d of %d SQuAD training examples whose answer text is not at answer_start in their context; "
        "check those examples' answer_start offsets",
        len(lost), len(ds),
    )
    return ds.select([i for i in range(len(ds)) if i not in lost])


def squad_eval_features(ds, tokenizer, max_length: int = 384, doc_stride: int = 128):
    """SQuAD evaluation features: windows keep ``example_id`` and an ``offset_mapping``
    whose non-context entries are None, so spans can only come from the context."""
    _check_stride(max_length, doc_stride)

    def encode(batch):
        enc = _squad_windows(batch, tokenizer, max_length, doc_stride)
        sample_map = enc.pop("overflow_to_sample_mapping")
        enc["example_id"] = []
        for i in range(len(enc["input_ids"])):
            seq_ids = enc.sequence_ids(i)
            enc["example_id"].append(batch["id"][sample_map[i]])
            enc["offset_mapping"][i] = [
                off if seq_ids[k] == 1 else None for k, off in enumerate(enc["offset_mapping"][i])
            ]
        return enc

    return ds.map(encode, batched=True, remove_columns=ds.column_names, desc="SQuAD eval features")


def _squad_windows(batch, tokenizer, max_length: int, doc_stride: int):
    """Question + context windows of at most ``max_length`` tokens overlapping by ``doc_stride``."""
    questions, contexts = _question_context(batch)
    return tokenizer(
        questions,
        contexts,
        truncation="only_second",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )


def _check_stride(max_length: int, doc_stride: int) -> None:
    if not 0 < doc_stride < max_length:
        raise CompressError(
            f"--doc-stride {doc_stride} must be positive and below --max-length {max_length}"
        )


def _question_context(rows) -> tuple[list[str], list[str]]:
    """SQuAD model inputs: (questions, contexts) of a dataset or a batch."""
    questions = [q.lstrip() for q in rows["question"]]  # leading spaces waste tokens in some vocabularies
    return questions, list(rows["context"])


def encode_examples(task: Task, tokenizer, rows, max_length: int, **kwargs):
    """Tokenise ``rows`` (a dataset or a batch) as one sequence per example, as the task's model reads them.

    Sentence tasks cut the longest text; SQuAD keeps the question and cuts the context
    (its first window only: :func:`squad_train_features` / :func:`squad_eval_features` make every window).
    ``kwargs`` go to the tokenizer (``padding``, ``return_tensors``).
    """
    texts, options = _BY_LAYOUT[task.behaviour.layout].texts(task, rows)
    if task.behaviour.tagged_words:
        check_fast(tokenizer)
    return tokenizer(*texts, max_length=max_length, **options, **kwargs)


def train_features(ds, task: Task, tokenizer, max_length: int, *, doc_stride: int):
    """Tokenised training features of raw examples ``ds``, as the task's kind makes them (no padding).

    ``doc_stride``: the overlap of SQuAD's windows over a long context (other kinds make one sequence per example).
    """
    return _BY_LAYOUT[task.behaviour.layout].train_features(ds, task, tokenizer, max_length, doc_stride)


# ---------------------------------------------------------------------------- per layout of examples


@dataclass(frozen=True)
class _LayoutInputs:
    """How the examples of one layout (``TaskKind.layout``) become model inputs."""

    texts: Callable  # (task, rows) -> (model input texts, tokenizer options): one sequence per example
    train_features: Callable  # (dataset, task, tokenizer, max_length, doc_stride) -> tokenised training features


def _sentence_texts(task: Task, rows):
    return tuple(list(rows[f]) for f in task.text_fields), {"truncation": True}  # datasets 5 columns are not lists


def _squad_texts(task: Task, rows):
    return _question_context(rows), {"truncation": "only_second"}  # keep the question, cut the context


def _word_texts(task: Task, rows):
    return ([list(w) for w in rows["tokens"]],), {"truncation": True, "is_split_into_words": True}


def _token_train_features(ds, task: Task, tokenizer, max_length: int, doc_stride: int):
    return token_features(ds, tokenizer, max_length, what=f"{task.display} training")


def _sentence_features(ds, task: Task, tokenizer, max_length: int, doc_stride: int):
    return tokenize_classification(ds, task, tokenizer, max_length).remove_columns(["idx"])


def _squad_features(ds, task: Task, tokenizer, max_length: int, doc_stride: int):
    return squad_train_features(ds, tokenizer, max_length, doc_stride)


# Sentence tasks (text fields + a label, one encoding per example), SQuAD (question/context,
# windows over long contexts) and token tasks (words, a tag each) are tokenised three ways.
_BY_LAYOUT: dict[str, _LayoutInputs] = {
    "sentences": _LayoutInputs(_sentence_texts, _sentence_features),
    "words": _LayoutInputs(_word_texts, _token_train_features),
    "squad": _LayoutInputs(_squad_texts, _squad_features),
}
