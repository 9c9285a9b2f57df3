"""Sentence-embedding folders (sentence-transformers layout): read them, encode with them, write them.

A sentence-transformers folder is a model directory whose root holds the transformer
(``config.json``, weights, tokenizer) plus files that say how token states become one
vector per sentence::

    modules.json                  [Transformer at "", Pooling at "1_Pooling", optional Normalize]
    sentence_bert_config.json     {"max_seq_length": 256, "do_lower_case": false}
    1_Pooling/config.json         {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": true, ...}
    config_sentence_transformers.json

Because the transformer sits at the root, every loader of this package reads the folder
as a plain BERT encoder (``runtime.load_model(dir, head="base")``), and the sidecars
``compression.json`` / ``metrics.json`` sit beside these files without disturbing
``SentenceTransformer(dir)``. A folder without ``modules.json`` is what
sentence-transformers makes of a plain Hugging Face encoder: mean pooling, no
normalisation.

Supported modules: Transformer (at the root), Pooling with one of the modes ``mean``,
``cls`` or ``max``, and Normalize; or a model2vec folder's StaticEmbedding (at the root,
optionally followed by Normalize: a mean of token vectors, see ``compress.core.formats.static``).
:func:`encode` reproduces ``SentenceTransformer.encode`` for exactly these (same truncation
length, pooling over real tokens, L2 normalisation); anything else (Dense layers, several
pooling modes at once, prompts) is refused by name rather than silently encoded differently.
"""

from __future__ import annotations

import copy
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from compress.core.formats.artifacts import load_config, model_format
from compress.core.formats.layout import SENTENCE_MODULES_FILE, STATIC
from compress.core.formats.records import read_record
from compress.core.formats.schemas import BOOL, STR, At, Inside, ListOf, OneOf, Record, Schema, Whole, inside, optional
from compress.core.formats.writes import write_json_atomic
from compress.core.data.batching import call_tokens_for, split_by_length
from compress.core.errors import CompressError
from compress.core.logs import progress
from compress.core.registry import Registry
from compress.core.formats.runtime import model_device
from compress.core.formats.static import max_length_of, static_config
from compress.core.model.structure import config_sizes, model_inputs

MODULES_FILE = SENTENCE_MODULES_FILE
TRANSFORMER_CONFIG = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
# sentence-transformers' legacy pooling switches (2.x-5.x write these; 6.x still reads them), by mode.
LEGACY_MODE_KEYS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
MODULE_TYPES = {  # modules.json "type" (last dotted component) -> what it is
    "Transformer": "transformer",
    "Pooling": "pooling",
    "Normalize": "normalize",
    "StaticEmbedding": "static",
}

# The files this module reads, as sentence-transformers writes them (the fields read; others pass). Every module's
# path stays inside the folder, whatever its type: a folder never reads a file outside itself.
FIX = "restore the sentence-transformers files or save the model again with SentenceTransformer.save"
MODULES = Schema(ListOf(Record({"type": STR, "path": optional(Inside())}, required=("type",))), fix=FIX)
TRANSFORMER_SCHEMA = Schema(Record({"max_seq_length": optional(Whole(1)), "do_lower_case": BOOL}), fix=FIX)
POOLING_SCHEMA = Schema(Record({
    "word_embedding_dimension": optional(Whole(1)), "embedding_dimension": optional(Whole(1)),
    "pooling_mode": OneOf((STR, ListOf(STR))), **{key: BOOL for key in LEGACY_MODE_KEYS.values()},
}), fix=FIX)


# ---------------------------------------------------------------------------- pooling


# A pooling: (token states (batch, seq, d), attention mask (batch, seq)) -> (batch, d).
POOLING: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry("pooling mode")


@POOLING.register("mean")
def mean_pooling(hidden: Tensor, mask: Tensor) -> Tensor:
    """Mean of the token states over real tokens: ``(batch, seq, d), (batch, seq) -> (batch, d)``."""
    keep = mask.unsqueeze(-1).to(hidden.dtype)  # (batch, seq, 1)
    return (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1e-9)


@POOLING.register("cls")
def cls_pooling(hidden: Tensor, mask: Tensor) -> Tensor:
    """The state of the first real token ([CLS] under right padding): ``(batch, d)``."""
    first = mask.to(torch.int).argmax(dim=1)  # (batch,)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]


@POOLING.register("max")
def max_pooling(hidden: Tensor, mask: Tensor) -> Tensor:
    """Feature-wise maximum over real tokens (padding is -inf): ``(batch, d)``."""
    padded = mask.unsqueeze(-1).expand_as(hidden) == 0
    return hidden.masked_fill(padded, float("-inf")).max(dim=1).values


# ---------------------------------------------------------------------------- the folder


@dataclass(frozen=True)
class SentenceSpec:
    """How a folder turns token states into sentence embeddings."""

    pooling: str = "mean"  # a POOLING name
    normalize: bool = False  # L2-normalise the pooled vector (a Normalize module)
    max_seq_length: int | None = None  # truncation length (None: the tokenizer's / the model's limit)
    do_lower_case: bool = False  # lower-case texts before tokenising
    dimension: int | None = None  # the pooled width as the folder states it
    sentence_transformers: bool = False  # the folder has modules.json (else: a plain encoder, ST's defaults)
    strip: bool = True  # strip texts before tokenising (ST's Transformer module does; StaticEmbedding and model2vec do not)

    def max_length(self, tokenizer, max_positions: int) -> int:
        """Tokens per text, as SentenceTransformer truncates them."""
        if self.max_seq_length:
            return int(self.max_seq_length)
        return int(min(tokenizer.model_max_length, max_positions))


def is_sentence_folder(path: Path | str) -> bool:
    """True when ``path`` is a sentence-transformers folder (has modules.json)."""
    return (Path(path) / MODULES_FILE).is_file()


def read_spec(path: Path | str) -> SentenceSpec:
    """The pooling, normalisation and truncation a folder asks for; a plain encoder gets ST's defaults."""
    path = Path(path)
    if not is_sentence_folder(path):  # a model2vec folder saved before it wrote modules.json still has its own reading
        return _static_spec(path, None) if model_format(path) == STATIC else SentenceSpec()
    modules = read_record(path / MODULES_FILE, MODULES)
    kinds = [(MODULE_TYPES.get(str(m.get("type", "")).rpartition(".")[2]), m) for m in modules]
    unknown = [str(m.get("type")) for kind, m in kinds if kind is None]
    if unknown:
        raise CompressError(
            f"{path} uses sentence-transformers module(s) {', '.join(unknown)}; compress supports "
            "Transformer + Pooling (+ Normalize) folders"
        )
    order = [kind for kind, _ in kinds]
    if order[:1] == ["static"]:
        return _static_spec(path, kinds)
    if order not in (["transformer", "pooling"], ["transformer", "pooling", "normalize"]):
        raise CompressError(f"{path}/{MODULES_FILE} lists {order}; compress supports transformer, pooling[, normalize] in that order")
    transformer, pooling = kinds[0][1], kinds[1][1]
    if module_dir(path, 0, transformer) != path:
        raise CompressError(
            f"the transformer of {path} lives in {transformer['path']}/, not at the root; "
            "pass a folder whose root holds config.json and the weights (sentence-transformers 2.x+ layout)"
        )
    st_config = path / TRANSFORMER_CONFIG
    tf = read_record(st_config, TRANSFORMER_SCHEMA) if st_config.is_file() else {}
    mode, dimension = _pooling_mode(module_dir(path, 1, pooling, POOLING_DIR) / "config.json")
    return SentenceSpec(
        pooling=mode, normalize=order[-1] == "normalize", max_seq_length=tf.get("max_seq_length"),
        do_lower_case=bool(tf.get("do_lower_case", False)), dimension=dimension, sentence_transformers=True,
    )


def module_dir(path: Path, index: int, module: dict, default: str = "") -> Path:
    """The folder of modules.json's module ``index`` in ``path`` (its ``path``, else ``default``), inside ``path``."""
    return inside(path, module.get("path") or default, At(path / MODULES_FILE, f"[{index}].path", FIX))


def _static_spec(path: Path, kinds: list[tuple[str | None, dict]] | None) -> SentenceSpec:
    """A model2vec folder: the mean of its token vectors, normalised as config.json and modules.json (if any) both say."""
    config = static_config(path)
    normalize = bool(config.get("normalize", False))
    if kinds is not None:
        order = [kind for kind, _ in kinds]
        if order not in (["static"], ["static", "normalize"]) or module_dir(path, 0, kinds[0][1]) != path:
            raise CompressError(f"{path}/{MODULES_FILE} lists {order}; compress supports a StaticEmbedding at the root, "
                                "optionally followed by Normalize")
        normalize = order[-1] == "normalize"
    if bool(config.get("normalize", False)) != normalize:
        raise CompressError(f"{path}: config.json says normalize={bool(config.get('normalize'))} but {MODULES_FILE} "
                            f"{'has' if normalize else 'has no'} Normalize module, so model2vec and sentence-transformers "
                            "encode differently; make the two agree")
    return SentenceSpec(pooling="mean", normalize=normalize, max_seq_length=max_length_of(config),
                        dimension=config.get("hidden_dim"), sentence_transformers=kinds is not None, strip=False)


def _pooling_mode(file: Path) -> tuple[str, int | None]:
    """(mode, dimension) from a Pooling module's config.json ``file``, either format (legacy switches or
    ``pooling_mode``)."""
    try:
        present = file.is_file()
    except OSError as err:  # a name longer than the file system takes
        raise CompressError(f"cannot read {file}: {err.strerror}; {FIX}") from None
    config = read_record(file, POOLING_SCHEMA) if present else {}
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes)
    else:
        modes = [mode for mode, key in LEGACY_MODE_KEYS.items() if config.get(key)] or ["mean"]
    if len(modes) != 1 or modes[0] not in POOLING:
        raise CompressError(
            f"{file} asks for pooling {' + '.join(map(str, modes))}; compress supports one of {', '.join(POOLING.names())}"
        )
    return modes[0], dimension


def write_sentence_files(directory: Path | str, spec: SentenceSpec, dimension: int) -> list[Path]:
    """Write modules.json, sentence_bert_config.json, the pooling config (and Normalize) into ``directory``.

    The files use the layout every sentence-transformers release since 2.0 reads. Returns
    the files written. sentence_bert_config.json is left out when it would say nothing but
    the defaults (no ``max_seq_length``, no lower-casing): Text Embeddings Inference refuses
    one without ``max_seq_length``, and without the file both it and sentence-transformers
    take the model's own limit.
    """
    directory = Path(directory)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"},
    ]
    if spec.normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": "sentence_transformers.models.Normalize"})
    pooling = {"word_embedding_dimension": int(dimension)}
    pooling.update({key: mode == spec.pooling for mode, key in LEGACY_MODE_KEYS.items()})
    pooling["include_prompt"] = True
    transformer = {"max_seq_length": spec.max_seq_length} if spec.max_seq_length else {}
    files = {
        MODULES_FILE: modules,
        TRANSFORMER_CONFIG: {**transformer, "do_lower_case": spec.do_lower_case},
        f"{POOLING_DIR}/config.json": pooling,
        ST_CONFIG: {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
    }
    if not transformer and not spec.do_lower_case:
        del files[TRANSFORMER_CONFIG]
        (directory / TRANSFORMER_CONFIG).unlink(missing_ok=True)  # a stale one would still be read
    written = []
    for name, content in files.items():
        write_json_atomic(directory / name, content)
        written.append(directory / name)
    return written


def copy_sentence_files(source: Path | str, target: Path | str) -> bool:
    """Carry a sentence-transformers folder's pooling/normalisation files over to a derived model directory.

    Returns True when ``source`` had them (nothing is written for a plain encoder).
    """
    if not is_sentence_folder(source):
        return False
    spec = read_spec(source)
    dimension = spec.dimension or config_sizes(load_config(source)).hidden  # DistilBERT names it dim
    write_sentence_files(target, spec, dimension)
    return True


# ---------------------------------------------------------------------------- encoding


def pooled_embeddings(model, batch: dict[str, Tensor], pooling: str = "mean") -> Tensor:
    """Run ``model`` (any ``runtime.load_model`` base model) and pool its last hidden state: ``(batch, d)``.

    Differentiable when the model is; before any normalisation (the target of distillation).
    """
    inputs = model_inputs(model, batch)  # token_type_ids only for the families that take them
    hidden = model(**inputs).last_hidden_state  # (batch, seq, d)
    return POOLING.get(pooling)(hidden, inputs["attention_mask"].to(hidden.device))


def finish(embeddings: Tensor, spec: SentenceSpec) -> Tensor:
    """The folder's final embeddings from pooled ones: L2-normalised when it has a Normalize module."""
    return F.normalize(embeddings, p=2, dim=-1) if spec.normalize else embeddings


def prepare_texts(texts: list[str], spec: SentenceSpec) -> list[str]:
    """Texts as SentenceTransformer tokenises them: stripped (not for a static folder), lower-cased when the folder says so."""
    texts = [str(t).strip() if spec.strip else str(t) for t in texts]
    return [t.lower() for t in texts] if spec.do_lower_case else texts


def tokenize(tokenizer, texts: list[str], spec: SentenceSpec, max_length: int) -> dict[str, Tensor]:
    """A padded batch of ``texts`` as SentenceTransformer makes it (truncated to ``max_length`` tokens).

    ``tokenizer(texts, padding=True, truncation="longest_first", max_length=...)``; for a fast tokenizer its Rust
    backend is called directly, set up once as that call sets it up (the same ids, masks and token types; half the
    0.2 ms the transformers call costs per sentence at batch 1, where a fused int8 model runs in 1.5 ms).
    """
    texts = prepare_texts(texts, spec)
    backend = _backend(tokenizer, max_length)
    if backend is None:
        return dict(tokenizer(texts, padding=True, truncation="longest_first", max_length=max_length, return_tensors="pt"))
    encodings = backend.encode_batch(texts)
    return {name: torch.tensor([getattr(e, ENCODING_FIELDS[name]) for e in encodings], dtype=torch.long)
            for name in tokenizer.model_input_names if name in ENCODING_FIELDS}


# a model input -> the ``tokenizers.Encoding`` attribute holding it
ENCODING_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
# tokenizer -> {(max_length, padding side, truncation side): its backend set up so}; dropped with the tokenizer
_BACKENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _backend(tokenizer, max_length: int):
    """A copy of a fast tokenizer's ``tokenizers.Tokenizer`` truncating and padding as :func:`tokenize` asks (what
    transformers' ``set_truncation_and_padding`` does before each call), or None where the call must go through
    transformers: a slow tokenizer, no padding token, or inputs its backend does not name alone."""
    backends = _BACKENDS.setdefault(tokenizer, {})
    key = (max_length, tokenizer.padding_side, tokenizer.truncation_side)  # the sides may be set after loading
    if key not in backends:
        backend = None
        if (getattr(tokenizer, "is_fast", False) and tokenizer.pad_token_id is not None
                and {"input_ids", "attention_mask"} <= set(tokenizer.model_input_names)
                and set(tokenizer.model_input_names) <= set(ENCODING_FIELDS)):
            backend = copy.deepcopy(tokenizer.backend_tokenizer)
            backend.enable_truncation(max_length, stride=0, strategy="longest_first",
                                      direction=tokenizer.truncation_side)
            backend.enable_padding(direction=tokenizer.padding_side, pad_id=tokenizer.pad_token_id,
                                   pad_type_id=tokenizer.pad_token_type_id, pad_token=tokenizer.pad_token)
        backends[key] = backend
    return backends[key]


def pooled(
    model,
    tokenizer,
    texts: list[str],
    spec: SentenceSpec | None = None,
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    device: torch.device | str | None = None,
    desc: str | None = None,
    call_tokens: float | None = None,
) -> Tensor:
    """Pooled embeddings of ``texts`` before normalisation: ``(n, d)`` float32 on the CPU, in the order given.

    ``model`` is anything ``runtime.load_model(dir, head="base")`` returns (PyTorch fp32,
    torch int8, ONNX Runtime, ...): only its ``last_hidden_state`` is read. Texts are
    batched longest first (less padding; the results do not depend on the order), and each
    batch is cut further into the sub-batches of similar lengths that cost the least padding
    plus calls (``compress.core.data.batching``; ``call_tokens`` is the price of a call, by
    default the one measured for the model's runtime, ``inf`` keeps whole batches): the
    runtimes compute every padded position. With ``desc``, a progress bar of that name.
    """
    spec = spec or SentenceSpec()
    sizes = config_sizes(model.config)  # once: encode() is called per sentence when serving at batch 1
    if max_length is None:
        max_length = spec.max_length(tokenizer, sizes.max_positions)
    if device is not None:
        model.to(device)
    target = device if device is not None else model_device(model)
    model.eval()
    if call_tokens is None:
        call_tokens = call_tokens_for(model)
    if len(texts) == 1:  # a server's batch 1: nothing to order, cut or gather
        with torch.inference_mode():
            batch = {k: v.to(target) for k, v in tokenize(tokenizer, texts, spec, max_length).items()}
            return pooled_embeddings(model, batch, spec.pooling).float().cpu()  # (1, d)
    order = torch.tensor(np.argsort([-len(str(t)) for t in texts], kind="stable"), dtype=torch.long)
    out = torch.zeros(len(texts), sizes.hidden)
    starts = range(0, len(texts), batch_size)
    with torch.inference_mode():
        for start in (starts if desc is None else progress(starts, desc=desc, unit="batch", leave=False)):
            index = order[start : start + batch_size]
            batch = tokenize(tokenizer, [texts[i] for i in index.tolist()], spec, max_length)
            for rows, part in sub_batches(batch, call_tokens, getattr(tokenizer, "padding_side", "right")):
                part = {k: v.to(target) for k, v in part.items()}
                out[index[rows]] = pooled_embeddings(model, part, spec.pooling).float().cpu()  # (rows, d)
    return out


def sub_batches(batch: dict[str, Tensor], call_tokens: float, padding_side: str = "right"):
    """``(rows, the batch's tensors for those rows cut to their longest)`` for each length sub-batch of ``batch``.

    One piece, the whole batch, when ``call_tokens`` is infinite, the tokenizer pads on the left (a left-padded
    row's real tokens do not start at position 0, so cutting columns would drop them) or no row is padded (one
    sentence, as a server at batch 1 calls it: nothing to cut, so nothing to pay for the split, 0.1 ms of a 3 ms call).
    """
    mask = batch["attention_mask"]  # (batch, seq)
    everything = torch.arange(mask.shape[0])
    if not np.isfinite(call_tokens) or padding_side != "right" or bool(mask[:, -1].all()):
        yield everything, batch
        return
    lengths = mask.sum(dim=1).tolist()  # (batch,) real tokens per row
    for piece in split_by_length(lengths, call_tokens):
        rows = torch.from_numpy(piece)
        longest = max(lengths[i] for i in piece.tolist())
        yield rows, {k: v[rows, :longest] for k, v in batch.items()}


def encode(
    model,
    tokenizer,
    texts: list[str],
    spec: SentenceSpec | None = None,
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    device: torch.device | str | None = None,
    call_tokens: float | None = None,
) -> np.ndarray:
    """Sentence embeddings of ``texts``, ``(n, d)`` float32, as ``SentenceTransformer(dir).encode`` gives them.

    Pooled as the folder says (see :func:`pooled` for the models and options), then
    L2-normalised when the folder has a Normalize module.
    """
    spec = spec or SentenceSpec()
    vectors = pooled(model, tokenizer, texts, spec, batch_size=batch_size, max_length=max_length, device=device,
                     call_tokens=call_tokens)
    return finish(vectors, spec).numpy()


def staged_sentence_files(spec: SentenceSpec, dimension: int) -> tuple[tempfile.TemporaryDirectory, dict[str, Path]]:
    """A temporary directory holding the folder files, and their names inside a model directory.

    For ``save_model_dir(files=...)``; keep the returned ``TemporaryDirectory`` alive until
    the model directory is written.
    """
    stage = tempfile.TemporaryDirectory(prefix="compress-sentence-")
    root = Path(stage.name)
    return stage, {str(p.relative_to(root)): p for p in write_sentence_files(root, spec, dimension)}
