"""The pretraining data pipeline: WordPiece training, documents, NSP pairs and MLM masks.

Checks the rules of the BERT paper / create_pretraining_data.py on generated data with
fixed seeds: 15% of the text selected, 80/10/10 corruption, special tokens never
predicted, whole words masked together, NSP pairs that really are (or are not) next.
"""

from __future__ import annotations

import random

import pytest
import torch

from compress.core.compat import TRANSFORMERS_MAJOR
from compress.core.errors import CompressError
from compress.teacher.corpus import (
    IGNORE_INDEX,
    Instance,
    PretrainCollator,
    build_instances,
    is_dataset_source,
    mask_tokens,
    masking_stats,
    read_documents,
    tokenize_documents,
)
from compress.teacher.tokenizer import SPECIAL_TOKENS, train_wordpiece

from tests.conftest import tiny_config

FIRST_ORDINARY_ID = len(SPECIAL_TOKENS)  # ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK]


# ---------------------------------------------------------------------------- helpers


def random_instances(vocab_size: int, n: int, seed: int = 0) -> list[Instance]:
    """Pairs of varied lengths (so per-sequence rounding averages out) over ordinary ids."""
    rng = random.Random(seed)

    def segment(low: int, high: int) -> tuple[int, ...]:
        return tuple(rng.randrange(FIRST_ORDINARY_ID, vocab_size) for _ in range(rng.randint(low, high)))

    return [Instance(segment(1, 90), segment(1, 35), rng.random() < 0.5) for _ in range(n)]


def collate_all(collator: PretrainCollator, instances: list[Instance], batch_size: int = 64):
    """(instances of the batch, batch dict) for consecutive steps."""
    for step, start in enumerate(range(0, len(instances), batch_size)):
        chunk = instances[start : start + batch_size]
        yield chunk, collator(chunk, step)


def unmasked_row(instance: Instance, width: int) -> list[int]:
    """``[CLS] A [SEP] B [SEP] [PAD]...`` with the tokenizer's ids: what the labels refer to."""
    row = [2, *instance.tokens_a, 3, *instance.tokens_b, 3]
    return row + [0] * (width - len(row))


def budget(n: int, p: float = 0.15) -> int:
    return min(n, max(1, round(n * p)))


# Synthetic token ids that name their document, sentence and position, for NSP checks.
def marker(doc: int, sentence: int, pos: int) -> int:
    return 1000 + doc * 10_000 + sentence * 10 + pos


def unmark(token: int) -> tuple[int, int, int]:
    token -= 1000
    return token // 10_000, (token % 10_000) // 10, token % 10


def marked_documents(n_docs: int, n_sentences: int, lengths: tuple[int, int], seed: int = 0) -> list[list[list[int]]]:
    rng = random.Random(seed)
    return [
        [[marker(d, s, p) for p in range(rng.randint(*lengths))] for s in range(n_sentences)] for d in range(n_docs)
    ]


# ---------------------------------------------------------------------------- MLM masking


def test_selected_fraction_is_15_percent_and_exact_per_sequence(tokenizer):
    instances = random_instances(len(tokenizer), 500)
    collator = PretrainCollator(tokenizer, seed=1)
    maskable_total = selected_total = 0
    for chunk, batch in collate_all(collator, instances):
        selected = batch["labels"] != IGNORE_INDEX  # (batch, seq)
        for row, instance in enumerate(chunk):
            n = len(instance.tokens_a) + len(instance.tokens_b)
            assert int(selected[row].sum()) == budget(n)
            maskable_total += n
            selected_total += int(selected[row].sum())
    assert maskable_total >= 20_000
    assert abs(selected_total / maskable_total - 0.15) <= 0.005


def test_80_10_10_split_and_no_special_token_selected(tokenizer):
    instances = random_instances(len(tokenizer), 1000, seed=2)
    stats = masking_stats(tokenizer, instances, seed=3)
    assert stats["maskable"] >= 40_000
    assert stats["special_selected"] == 0
    assert abs(stats["selected_fraction"] - 0.15) <= 0.005
    assert abs(stats["mask_fraction"] - 0.80) <= 0.02
    assert abs(stats["random_fraction"] - 0.10) <= 0.02
    assert abs(stats["kept_fraction"] - 0.10) <= 0.02
    # Everything selected is accounted for exactly once.
    assert stats["mask"] + stats["random"] + stats["unchanged"] == stats["selected"]
    assert stats["unchanged"] == stats["kept"] + stats["random_same"]


def test_labels_and_special_positions(tokenizer):
    instances = random_instances(len(tokenizer), 300, seed=4)
    collator = PretrainCollator(tokenizer, seed=5)
    specials = set(tokenizer.all_special_ids)
    random_ids = set(collator.random_token_ids.tolist())
    for chunk, batch in collate_all(collator, instances):
        ids, labels = batch["input_ids"], batch["labels"]
        original = torch.tensor([unmasked_row(x, ids.shape[1]) for x in chunk])  # (batch, seq)
        selected = labels != IGNORE_INDEX
        special = (original == tokenizer.cls_token_id) | (original == tokenizer.sep_token_id) | (original == 0)
        assert not (selected & special).any()  # [CLS], [SEP], [PAD] never predicted
        assert torch.equal(ids[special], original[special])  # and never corrupted
        assert torch.equal(labels[selected], original[selected])
        assert (labels[~selected] == IGNORE_INDEX).all()
        assert torch.equal(ids[~selected], original[~selected])  # only selected tokens change
        replaced = selected & (ids != original) & (ids != tokenizer.mask_token_id)
        assert set(ids[replaced].tolist()) <= random_ids and not set(ids[replaced].tolist()) & specials


def test_mask_tokens_budget_cap_and_input_untouched():
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(FIRST_ORDINARY_ID, 50, (8, 100))  # (batch, seq)
    maskable = torch.ones(8, 100, dtype=torch.bool)
    maskable[:, 0] = maskable[:, -1] = False
    before = input_ids.clone()
    masked, labels = mask_tokens(
        input_ids, maskable=maskable, word_start=torch.ones_like(maskable), mask_token_id=4,
        random_token_ids=torch.arange(FIRST_ORDINARY_ID, 50), generator=generator, max_predictions=5,
    )  # fmt: skip
    assert torch.equal(input_ids, before)
    assert ((labels != IGNORE_INDEX).sum(dim=1) == 5).all()  # round(0.15 * 98) = 15, capped at 5
    assert masked.data_ptr() != input_ids.data_ptr()


def random_words(seq: int, rng: random.Random) -> tuple[list[bool], list[bool]]:
    """(maskable, word_start) of ``[CLS] words [SEP] [PAD]...`` with words of 1-4 pieces."""
    length = rng.randint(20, seq - 2)
    starts: list[bool] = []
    while len(starts) < length:
        starts += [True] + [False] * rng.choice([0, 0, 0, 1, 2, 3])
    starts = starts[:length]
    maskable = [False] + [True] * length + [False] * (seq - 1 - length)
    word_start = [True] + starts + [True] * (seq - 1 - length)
    return maskable, word_start


def test_whole_word_masking_keeps_words_together_within_budget():
    rng = random.Random(6)
    rows = [random_words(128, rng) for _ in range(300)]
    maskable = torch.tensor([m for m, _ in rows])
    word_start = torch.tensor([w for _, w in rows])
    input_ids = torch.randint(FIRST_ORDINARY_ID, 200, maskable.shape)
    _, labels = mask_tokens(
        input_ids, maskable=maskable, word_start=word_start, mask_token_id=4,
        random_token_ids=torch.arange(FIRST_ORDINARY_ID, 200), generator=torch.Generator().manual_seed(1),
        whole_word=True,
    )  # fmt: skip
    selected = labels != IGNORE_INDEX
    multi_piece = 0
    for row in range(len(rows)):
        n = int(maskable[row].sum())
        assert int(selected[row].sum()) <= budget(n)
        assert not (selected[row] & ~maskable[row]).any()
        # Walk the words: all pieces of a word share the first piece's fate.
        positions = maskable[row].nonzero().flatten().tolist()
        word: list[int] = []
        for pos in positions + [None]:
            if pos is None or word_start[row, pos]:
                if word:
                    fates = {bool(selected[row, p]) for p in word}
                    assert len(fates) == 1, f"row {row}: word {word} partly selected"
                    multi_piece += len(word) > 1 and fates == {True}
                word = []
            if pos is not None:
                word.append(pos)
    assert multi_piece > 100  # the check above really saw whole multi-piece words selected
    # Skipping words that would overshoot still fills the 15% budget nearly exactly.
    assert abs(int(selected.sum()) / int(maskable.sum()) - 0.15) <= 0.01


def test_whole_word_masking_through_the_collator(tokenizer):
    # Each multi-piece word of the tiny vocabulary ("movie ##s", "act ##ing", ...) is masked as a unit.
    words = "the movies was boring and the actors did really love acting . she hated cats".split()
    rng = random.Random(7)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(10, 40))) for _ in range(400)]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    instances = [Instance(tuple(a), tuple(b), False) for a, b in zip(ids[::2], ids[1::2])]
    collator = PretrainCollator(tokenizer, whole_word=True, seed=8)
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    for chunk, batch in collate_all(collator, instances):
        selected = batch["labels"] != IGNORE_INDEX
        for row, instance in enumerate(chunk):
            tokens = [2, *instance.tokens_a, 3, *instance.tokens_b, 3]
            for pos in range(1, len(tokens)):
                if pieces[tokens[pos]].startswith("##") and tokens[pos - 1] not in (2, 3):
                    assert selected[row, pos] == selected[row, pos - 1]
            n = len(instance.tokens_a) + len(instance.tokens_b)
            assert int(selected[row].sum()) <= budget(n)


def test_masks_depend_on_seed_and_step_only(tokenizer):
    instances = random_instances(len(tokenizer), 32, seed=9)
    first = PretrainCollator(tokenizer, seed=10)(instances, step=3)
    torch.manual_seed(1234)  # the global RNG must not matter
    torch.rand(5)
    again = PretrainCollator(tokenizer, seed=10)(instances, step=3)
    for key in first:
        assert torch.equal(first[key], again[key]), key
    other_step = PretrainCollator(tokenizer, seed=10)(instances, step=4)
    other_seed = PretrainCollator(tokenizer, seed=11)(instances, step=3)
    assert not torch.equal(first["labels"], other_step["labels"])
    assert not torch.equal(first["labels"], other_seed["labels"])


def test_batch_layout_types_padding_and_nsp_labels(tokenizer):
    instances = [Instance((10, 11, 12), (13, 14), False), Instance((20,), (21, 22, 23, 24, 25, 26), True)]
    batch = PretrainCollator(tokenizer, seed=0)(instances, step=0)
    assert batch["input_ids"].shape == (2, 10)  # the longer pair: 1 + 6 + 3 specials
    assert batch["token_type_ids"][0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 0, 0]
    assert batch["token_type_ids"][1].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    assert batch["attention_mask"][0].tolist() == [1] * 8 + [0, 0]
    assert batch["attention_mask"][1].tolist() == [1] * 10
    assert batch["input_ids"][0, -2:].tolist() == [tokenizer.pad_token_id] * 2
    assert batch["next_sentence_label"].tolist() == [0, 1]  # 0 IsNext, 1 NotNext


# ---------------------------------------------------------------------------- NSP instances


def test_random_next_fraction_is_half():
    # Long documents and full-length targets: the NSP coin decides every pair.
    docs = marked_documents(20, 600, (2, 5), seed=11)
    instances = build_instances(docs, 32, seed=12, short_seq_prob=0.0, dupe_factor=2)
    assert len(instances) >= 3000
    fraction = sum(x.is_random_next for x in instances) / len(instances)
    assert abs(fraction - 0.5) <= 0.05


def test_nsp_stays_balanced_on_short_documents():
    # One- and two-sentence documents (paragraph-sized, as in WikiText or Shakespeare) make
    # the reference algorithm force NotNext for every one-sentence chunk; cutting such a
    # chunk in two keeps the split at 50/50.
    docs = marked_documents(800, 2, (3, 12), seed=21)
    docs = [doc[: 1 + i % 2] for i, doc in enumerate(docs)]
    instances = build_instances(docs, 64, seed=22)
    fraction = sum(x.is_random_next for x in instances) / len(instances)
    assert abs(fraction - 0.5) <= 0.05


def test_is_next_continues_and_not_next_comes_from_another_document():
    # Sentences of exactly 4 tokens and room for 16: chunks end on a sentence boundary, so an
    # IsNext pair is never truncated and B must start right after A's last token.
    docs = marked_documents(30, 25, (4, 4), seed=13)
    instances = build_instances(docs, 16 + 3, seed=14, short_seq_prob=0.0)
    is_next = [x for x in instances if not x.is_random_next]
    not_next = [x for x in instances if x.is_random_next]
    assert len(is_next) > 50 and len(not_next) > 50
    for x in is_next:
        # B continues the text right after A's last token: the next token of the same
        # sentence (a one-sentence chunk cut in two) or the first of the next sentence.
        doc_a, last_sentence, position = unmark(x.tokens_a[-1])
        expected = (doc_a, last_sentence, position + 1) if position < 3 else (doc_a, last_sentence + 1, 0)
        assert unmark(x.tokens_b[0]) == expected
        assert all(unmark(t)[0] == doc_a for t in x.tokens_a + x.tokens_b)
    for x in not_next:
        docs_a = {unmark(t)[0] for t in x.tokens_a}
        docs_b = {unmark(t)[0] for t in x.tokens_b}
        assert len(docs_a) == 1 and len(docs_b) == 1 and docs_a != docs_b


def test_instances_fit_max_length_and_are_reproducible(tokenizer):
    docs = marked_documents(20, 30, (1, 40), seed=15)
    instances = build_instances(docs, 32, seed=16)
    assert instances == build_instances(docs, 32, seed=16)
    assert instances != build_instances(docs, 32, seed=17)
    for x in instances:
        assert len(x.tokens_a) >= 1 and len(x.tokens_b) >= 1
        assert len(x.tokens_a) + len(x.tokens_b) + 3 <= 32
    assert max(len(x.tokens_a) + len(x.tokens_b) + 3 for x in instances) == 32  # truncated to fit exactly


def test_short_seq_prob_makes_shorter_pairs():
    docs = marked_documents(20, 60, (1, 3), seed=18)

    def mean_length(short_seq_prob: float) -> float:
        instances = build_instances(docs, 64, seed=19, short_seq_prob=short_seq_prob)
        return sum(len(x.tokens_a) + len(x.tokens_b) for x in instances) / len(instances)

    # Targets drawn from [2, 61] instead of 61: about half as long on average.
    assert mean_length(1.0) < 0.7 * mean_length(0.0)


def test_build_instances_needs_two_documents():
    with pytest.raises(CompressError, match="at least 2 documents"):
        build_instances([[[5, 6, 7]], [], [[]]], 16, seed=0)
    with pytest.raises(CompressError, match="max_length"):
        build_instances(marked_documents(3, 3, (2, 2)), 4, seed=0)


# ---------------------------------------------------------------------------- WordPiece


LEXICON = "play played playing player plays display stay stayed staying stays day days say says saying".split()


def write_corpus(path, n_lines: int = 400, seed: int = 0):
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(LEXICON) for _ in range(rng.randint(3, 12))) + "." for _ in range(n_lines)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_wordpiece_round_trips_offline(tmp_path):
    from transformers import AutoTokenizer

    tok = train_wordpiece([write_corpus(tmp_path / "corpus.txt")], vocab_size=120)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == list(SPECIAL_TOKENS)
    assert len(tok) <= 120
    tok.save_pretrained(tmp_path / "tok")
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    assert (tmp_path / "tok" / "vocab.txt").is_file() or TRANSFORMERS_MAJOR >= 5  # 5.x writes tokenizer.json only
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok", local_files_only=True)
    special_ids = [loaded.pad_token_id, loaded.unk_token_id, loaded.cls_token_id, loaded.sep_token_id]
    assert special_ids + [loaded.mask_token_id] == [0, 1, 2, 3, 4]
    pair = loaded("Played days", "stay")
    ids = pair["input_ids"]
    assert ids[0] == 2 and ids[-1] == 3 and ids.count(3) == 2  # [CLS] A [SEP] B [SEP]
    first_sep = ids.index(3)
    assert pair["token_type_ids"] == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    assert ids == tok("Played days", "stay")["input_ids"]
    # A word never seen in training is split into known pieces, continuations marked ##.
    assert "displayed" not in loaded.get_vocab()
    pieces = loaded.tokenize("displayed")
    assert len(pieces) >= 2 and not pieces[0].startswith("##") and all(p.startswith("##") for p in pieces[1:])
    assert loaded.decode(loaded("displayed")["input_ids"], skip_special_tokens=True) == "displayed"


def test_wordpiece_errors_name_the_problem(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    with pytest.raises(CompressError, match="missing.txt does not exist"):
        train_wordpiece([tmp_path / "missing.txt"])
    (tmp_path / "empty.txt").write_text("  \n\n", encoding="utf-8")
    with pytest.raises(CompressError, match="empty.txt is empty"):
        train_wordpiece([corpus, tmp_path / "empty.txt"])
    (tmp_path / "latin1.txt").write_bytes("fine\nstill fine\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(CompressError, match=r"latin1.txt:3: not valid UTF-8"):
        train_wordpiece([tmp_path / "latin1.txt"])
    with pytest.raises(CompressError, match="vocab_size 20 is smaller than the") as err:
        train_wordpiece([corpus], vocab_size=20)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- documents


def test_read_documents_splits_blocks_sentences_and_skips_headings(tmp_path):
    (tmp_path / "a.txt").write_text(
        " = Title = \n\nFirst one. Second one!  Third?\nA new line\n\n\n = = Sub = = \n\nOther doc here.\n",
        encoding="utf-8",
    )
    assert read_documents(tmp_path / "a.txt") == [
        ["First one.", "Second one!", "Third?", "A new line"],
        ["Other doc here."],
    ]
    # A directory means its *.txt files, recursively, in sorted order; others are ignored.
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("Bee.\n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("Ignored.\n", encoding="utf-8")
    assert read_documents(tmp_path)[-1] == ["Bee."]
    assert len(read_documents(tmp_path)) == 3
    # Prose wrapped at a fixed width keeps whole sentences.
    (tmp_path / "wrapped.txt").write_text("The cat\nsat on the mat. It\nslept.\n", encoding="utf-8")
    assert read_documents(tmp_path / "wrapped.txt") == [["The cat sat on the mat.", "It slept."]]


def test_read_documents_errors_are_one_line(tmp_path):
    cases = []
    with pytest.raises(CompressError, match="does not exist") as err:
        read_documents([tmp_path / "nope.txt"])
    cases.append(err)
    (tmp_path / "bad.txt").write_bytes(b"ok\n\nalso ok\n\xff\xfe broken\n")
    with pytest.raises(CompressError, match=r"bad.txt:4: not valid UTF-8") as err:
        read_documents(tmp_path / "bad.txt")
    cases.append(err)
    (tmp_path / "blank.txt").write_text("\n  \n = Only a heading = \n", encoding="utf-8")
    with pytest.raises(CompressError, match="no text found") as err:
        read_documents(tmp_path / "blank.txt")
    cases.append(err)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(CompressError, match="no \\*.txt files") as err:
        read_documents(tmp_path / "empty_dir")
    cases.append(err)
    assert all("\n" not in str(e.value) for e in cases)


def test_tokenize_documents_keeps_alignment_without_specials(tokenizer):
    docs = [["The cat sat.", "On the mat!"], ["..."], ["Dog"]]
    ids = tokenize_documents(docs, tokenizer)
    assert len(ids) == 3 and len(ids[0]) == 2
    assert ids[0][0] == tokenizer("The cat sat.", add_special_tokens=False)["input_ids"]
    specials = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
    assert not any(t in specials for doc in ids for s in doc for t in s)


# ---------------------------------------------------------------------------- end to end


def test_pipeline_feeds_bert_for_pretraining(tmp_path):
    from transformers import BertForPreTraining

    corpus = tmp_path / "corpus.txt"
    rng = random.Random(18)

    def sentence() -> str:
        return " ".join(rng.choice(LEXICON) for _ in range(rng.randint(3, 9))) + "."

    blocks = [" ".join(sentence() for _ in range(rng.randint(2, 6))) for _ in range(30)]
    corpus.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    tok = train_wordpiece([corpus], vocab_size=100)
    instances = build_instances(tokenize_documents(read_documents(corpus), tok), 48, seed=19)
    batch = PretrainCollator(tok, whole_word=True, seed=20)(instances[:8], step=0)
    assert batch["input_ids"].shape[1] <= 48
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(vocab_size=len(tok)))
    loss = model(**batch).loss
    assert torch.isfinite(loss) and loss.item() > 0


# ---------------------------------------------------------------------------- datasets corpora


def test_read_documents_from_a_saved_datasets_corpus(tmp_path):
    import datasets

    rows = ["First one. Second one!", "", "Other doc.\n\nA third doc? Yes.", " = Heading = "]
    datasets.Dataset.from_dict({"id": list(range(4)), "text": rows}).save_to_disk(str(tmp_path / "flat"))
    expected = [["First one.", "Second one!"], ["Other doc."], ["A third doc?", "Yes."]]
    assert is_dataset_source(tmp_path / "flat") and not is_dataset_source(tmp_path)
    assert read_documents(tmp_path / "flat") == expected  # each row a document; blank rows and headings dropped
    # a DatasetDict contributes its train split; text files and datasets mix in order
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": ["Only row."]}),
                          "test": datasets.Dataset.from_dict({"body": ["Never read."]})}).save_to_disk(str(tmp_path / "dd"))
    (tmp_path / "a.txt").write_text("From a file.\n", encoding="utf-8")
    assert read_documents([tmp_path / "a.txt", tmp_path / "dd", tmp_path / "flat"]) == [
        ["From a file."], ["Only row."], *expected]


def test_datasets_corpus_errors_are_one_line(tmp_path, monkeypatch):
    import datasets

    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": ["x."]})}).save_to_disk(str(tmp_path / "notrain"))
    with pytest.raises(CompressError, match="has splits test and no 'train'"):
        read_documents(tmp_path / "notrain")
    datasets.Dataset.from_dict({"title": ["t"], "body": ["b."]}).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(CompressError, match=r"no 'text' column and no single string column \(columns: title, body\)"):
        read_documents(tmp_path / "two")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CompressError, match="cannot load corpus wikitext from the Hugging Face hub") as err:
        read_documents(["hf:wikitext:wikitext-2-raw-v1"])
    assert "\n" not in str(err.value) and "save_to_disk" in str(err.value)
