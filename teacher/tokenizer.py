"""Train a BERT WordPiece vocabulary on plain-text files.

The result is an ordinary ``transformers.BertTokenizerFast``: ``save_pretrained`` writes
``vocab.txt`` and ``tokenizer.json`` and the folder reloads offline with
``AutoTokenizer.from_pretrained``. Special tokens take the first ids, in BERT's order
for this toolkit: ``[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertTokenizerFast

from compress.core.data.files import read_text_file
from compress.core.errors import CompressError
from compress.core.paths import check_input_file

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)  # their ids are their positions: 0..4
CONTINUATION = "##"  # WordPiece prefix of a piece that continues a word
MODEL_MAX_LENGTH = 512  # BERT's position-embedding table


def train_wordpiece(
    files: Iterable[str | Path],
    vocab_size: int = 30522,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    show_progress: bool = False,
):
    """Train a WordPiece vocabulary (BERT paper, section 3; Wu et al. 2016) -> ``BertTokenizerFast``.

    Normalisation and pre-tokenisation are BERT's (clean text, split CJK characters,
    lowercase and strip accents when ``lowercase``; split on whitespace and punctuation).
    ``vocab_size`` counts the special tokens and the alphabet; ``limit_alphabet`` keeps
    only the most frequent characters, the rest become ``[UNK]``.

    Training is not bit-reproducible: ``tokenizers`` (0.22) numbers the ``##`` pieces in
    hash-map order and breaks ties between equally frequent merges by those numbers
    (huggingface/tokenizers#1794), so two runs on the same corpus can differ in a handful
    of rare tokens (10 of 8000 on WikiText-2 valid + Tiny Shakespeare). Train once and
    ``save_pretrained`` the result; every later stage reads the saved vocabulary.
    """
    paths = _check_files(files)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise CompressError(
            f"vocab_size {vocab_size} leaves no room for any token beyond the {len(SPECIAL_TOKENS)} special ones; "
            "use a few thousand (BERT uses 30522)"
        )
    backend = Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix=CONTINUATION))
    # strip_accents=None follows lowercase, as BERT's uncased/cased models do.
    backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix=CONTINUATION,
        show_progress=show_progress,
    )
    backend.train([str(p) for p in paths], trainer)
    _check_trained(backend, vocab_size, limit_alphabet)
    backend.post_processor = _bert_template()
    backend.decoder = decoders.WordPiece(prefix=CONTINUATION)
    return _wrap(backend, lowercase)


def _check_files(files: Iterable[str | Path]) -> list[Path]:
    """Each file exists, is UTF-8 and holds some text; errors name the file (and line)."""
    if isinstance(files, (str, Path)):
        files = [files]
    paths = [Path(f) for f in files]
    if not paths:
        raise CompressError("no training files given for the WordPiece vocabulary; pass at least one text file")
    for path in paths:
        check_input_file(path, "WordPiece training file")  # missing, a directory, a FIFO, a device: said as such
        if not read_text_file(path).strip():
            raise CompressError(f"WordPiece training file {path} is empty; pass files with text")
    return paths


def _check_trained(backend, vocab_size: int, limit_alphabet: int) -> None:
    """The trainer silently exceeds ``vocab_size`` when specials + alphabet do not fit: refuse."""
    got = backend.get_vocab_size()
    if got > vocab_size:
        raise CompressError(
            f"vocab_size {vocab_size} is smaller than the {got} special tokens and characters "
            f"(with their {CONTINUATION} forms) of this corpus; raise vocab_size to more than {got} "
            f"or lower limit_alphabet (now {limit_alphabet})"
        )
    vocab = backend.get_vocab()
    for want, token in enumerate(SPECIAL_TOKENS):
        assert vocab[token] == want, f"{token} has id {vocab[token]}, expected {want}"


def _bert_template():
    """Single = ``[CLS] A [SEP]``; pair = ``[CLS] A [SEP] B [SEP]`` with type ids 0 then 1."""
    return processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, SPECIAL_TOKENS.index(CLS)), (SEP, SPECIAL_TOKENS.index(SEP))],
    )


def _wrap(backend, lowercase: bool):
    return BertTokenizerFast(
        tokenizer_object=backend,
        do_lower_case=lowercase,
        unk_token=UNK,
        sep_token=SEP,
        pad_token=PAD,
        cls_token=CLS,
        mask_token=MASK,
        model_max_length=MODEL_MAX_LENGTH,
    )
