"""The ``ctranslate2`` format at run time: ``ctranslate2.Encoder`` for the encoder, NumPy for the task head beside it.

Writing the folder is ``compress.core.formats.ctranslate2``'s. CTranslate2's Encoder returns the last hidden state
and the pooler output only; the head (``compression.json``'s ``ctranslate2.head``: what it reads and its Linear
layers with their activations, the tensors in ``head.safetensors``) runs on them here, so a folder answers the
Hugging Face call convention like any runner. The Encoder takes each sentence's real tokens as a ragged list of ids
(no padding), and its outputs are put back into the caller's padded (batch, seq) layout, zeros past each sentence.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.numpy import load_file

from compress.core.errors import CompressError, reason
from compress.core.formats.folder import ModelFolder
from compress.core.formats.layout import CTRANSLATE2, CTRANSLATE2_FILE, HEAD_FILE
from compress.core.formats.load_checks import load_graph_runner
from compress.core.formats.records import read_compression
from compress.core.formats.runners import NumpyRunner
from compress.core.model.heads import get_head
from compress.core.registry import Registry

# A head layer's activation, by the name HeadLayers gives it (compress.core.model.families): (batch[, seq], d) -> same.
ACTIVATIONS: Registry[Callable[[np.ndarray], np.ndarray]] = Registry("head activation")
ACTIVATIONS.register("tanh", np.tanh)
ACTIVATIONS.register("relu", lambda x: np.maximum(x, 0.0))
READS = ("pooler_output", "first_token", "tokens")  # what a head reads: HeadLayers.reads


@dataclass(frozen=True)
class Feeds:
    """A batch as the Encoder takes it: each row's real tokens (ragged lists) and where they sit in the padded batch."""

    ids: list[list[int]]  # batch x (its length) token ids
    token_types: list[list[int]] | None  # the same shape, for families with segment embeddings
    mask: np.ndarray  # (batch, seq) bool: the caller's real positions, True where a token is


class CTranslate2Runner(NumpyRunner):
    """A CTranslate2 Encoder on the CPU (its stored compute type) and the folder's head in NumPy."""

    format = CTRANSLATE2

    def __init__(self, path: Path, config, head: str, *, threads: int | None = None, record: dict[str, Any] | None = None):
        super().__init__(path, config, head, get_head(head).outputs)
        spec = (record if record is not None else read_compression(path)).get(CTRANSLATE2)
        if not isinstance(spec, dict):
            raise CompressError(f"{self.path}/compression.json has no {CTRANSLATE2} record (its head and inputs); "
                                "re-create the folder with compress export --format ctranslate2")
        # deferred: CTranslate2's extension, loaded by the folders that need it
        import ctranslate2

        try:
            encoder = ctranslate2.Encoder(str(self.path), device="cpu", compute_type="default",
                                          intra_threads=threads or torch.get_num_threads(), inter_threads=1)
        except (RuntimeError, ValueError, OSError) as err:
            why = reason(err)
            raise CompressError(f"CTranslate2 cannot load {self.path}: {why}") from None
        object.__setattr__(self, "encoder", encoder)  # hidden from nn.Module's registry: not a submodule
        self.compute_type = encoder.compute_type
        self.token_types = bool(spec.get("token_type_ids"))
        self.reads, self.layers = self._head(spec.get("head"))

    def _head(self, layout: dict[str, Any] | None) -> tuple[str, list[tuple[np.ndarray, np.ndarray, Callable | None]]]:
        """(what the head reads, its layers as (weight (out, in), bias (out,), activation)); a bare encoder: tokens."""
        if self.head == "base":
            return "tokens", []
        if not isinstance(layout, dict) or not layout.get("linears"):
            raise CompressError(f"{self.path} has a {self.head} head but compression.json does not record its layers; "
                                "re-create the folder with compress export --format ctranslate2")
        file = self.path / HEAD_FILE
        if not file.is_file():
            raise CompressError(f"{self.path} has no {HEAD_FILE} (its {self.head} head); is the directory complete?")
        tensors = load_file(str(file))
        layers = []
        for name, activation in layout["linears"]:
            if f"{name}.weight" not in tensors or f"{name}.bias" not in tensors:
                raise CompressError(f"{file} lacks {name}.weight or {name}.bias; re-create the folder")
            act = None if activation is None else ACTIVATIONS.get(activation)  # an unknown name refused now
            layers.append((tensors[f"{name}.weight"], tensors[f"{name}.bias"], act))
        if layout.get("reads") not in READS:
            raise CompressError(f"{self.path}: its head reads {layout.get('reads')!r}; valid: {', '.join(READS)}")
        return layout["reads"], layers

    def feeds(self, inputs: dict[str, np.ndarray]) -> Feeds:
        # Each row's real tokens, in order: the Encoder pads (and numbers positions) itself.
        mask = inputs["attention_mask"].astype(bool)  # (batch, seq)
        if not mask.any(axis=1).all():
            raise CompressError(f"{self.path}: a row of the batch has no tokens (its attention mask is all zeros)")
        ids = [row[keep].tolist() for row, keep in zip(inputs["input_ids"], mask)]
        types = None
        if self.token_types:
            types = [row[keep].tolist() for row, keep in zip(inputs["token_type_ids"], mask)]
        return Feeds(ids, types, mask)

    def call(self, feeds: Feeds) -> list[np.ndarray]:
        out = self.encoder.forward_batch(feeds.ids, token_type_ids=feeds.token_types)
        hidden = np.array(out.last_hidden_state)  # (batch, longest, d)
        lengths = feeds.mask.sum(axis=1)
        states = np.zeros((*feeds.mask.shape, hidden.shape[-1]), dtype=np.float32)  # (batch, seq, d)
        # The k-th real position of row i holds the Encoder's k-th state of row i (both read row by row).
        states[feeds.mask] = hidden[np.arange(hidden.shape[1])[None, :] < lengths[:, None]]
        if not self.layers:
            return [states]
        if self.reads == "pooler_output":  # the pooler's dense + tanh over the first token, computed by the Encoder
            x = np.array(out.pooler_output)  # (batch, d)
        else:
            x = states[:, 0] if self.reads == "first_token" else states  # (batch, d) or (batch, seq, d)
        for weight, bias, activation in self.layers:
            x = x @ weight.T + bias  # (batch[, seq], out)
            if activation is not None:
                x = activation(x)
        if len(self.output_names) == 1:
            return [np.ascontiguousarray(x, dtype=np.float32)]
        # A span head's columns are its outputs, in order (start, end): (batch, seq) each.
        return [np.ascontiguousarray(x[..., i], dtype=np.float32) for i in range(len(self.output_names))]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, compute_type={self.compute_type}"


def load_ctranslate2(folder: ModelFolder, options: dict[str, Any]):
    """Load a ``ctranslate2`` directory as a :class:`CTranslate2Runner`."""
    runner = functools.partial(CTranslate2Runner, record=folder.record)
    return load_graph_runner(folder, options, CTRANSLATE2, CTRANSLATE2_FILE, runner)
