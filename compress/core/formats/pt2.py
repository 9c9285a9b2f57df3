"""The ``inc-pt2e`` format: a ``torch.export`` program quantized by Neural Compressor (PT2E), checked, loaded and run.

``model.pt2`` is loaded only after :func:`check_pt2_archive` found nothing in it that loading
could execute; :class:`ExportedRunner` compiles it with inductor, one static graph per padded
input shape (:func:`padded_shape`).
"""

from __future__ import annotations

import io
import json
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from compress.core.errors import CompressError, reason
from compress.core.formats.architecture import structure_of
from compress.core.formats.folder import ModelFolder
from compress.core.formats.layout import INC_PT2E
from compress.core.formats.load_checks import check_options, with_info
from compress.core.formats.runners import Runner
from compress.core.formats.torch_int8 import quiet_torch_ao
from compress.core.model.heads import get_head
from compress.core.model.structure import config_sizes, input_names

PT2_FILE = "model.pt2"
NO_COMPILE_ENV = "COMPRESS_NO_COMPILE"  # "1": run INC programs eagerly (tests; no C++ compiler)
MAX_COMPILED_SHAPES = 64  # graphs compiled per INC program before dynamo falls back to eager


def padded_shape(batch: int, seq: int, max_seq: int) -> tuple[int, int]:
    """The (batch, seq) an INC program runs compiled at: the batch rounded up to a power of two,
    the length to a multiple of 32 tokens (of 64 beyond 128), at most ``max_seq``.

    Inductor compiles one graph per input shape (tens of seconds each for a 6-layer model on
    2 cores), and the dynamic-shape graph it falls back to ran 2.3x slower than a static one
    (batch 32, seq 64, 6 layers x 384); so inputs are padded to these few shapes (1, 2, 4, ...
    x 32, 64, 96, 128, 192, ...), which keep the usual latency points (batch 1/8/32, seq
    128/384) exact. Padded positions are masked and padding rows dropped: the outputs are the
    unpadded ones up to int8 rounding steps that sums in another order can flip.
    """
    step = 32 if seq <= 128 else 64
    return 1 << (batch - 1).bit_length(), max(seq, min(max_seq, -(-seq // step) * step))


class ExportedRunner(Runner):
    """A ``torch.export`` program (INC PT2E int8), compiled by inductor with freezing, one graph per padded shape.

    Freezing turns the graph's dequantize(int8 weight) -> linear patterns into packed
    int8 GEMMs; without it the program runs the q/dq graph in fp32 (correct, not fast).
    Compiled, every batch is padded to :func:`padded_shape` (extra rows repeat the first,
    extra positions are masked out) and the outputs are cut back, so an evaluation compiles
    a handful of static graphs rather than one per (batch, length) it meets.
    """

    format = INC_PT2E

    def __init__(self, path: Path, config, head: str, output_names: tuple[str, ...], *, compile: bool | None = None):
        super().__init__(path, config, head, output_names)
        program = load_exported_program(path / PT2_FILE).module()
        object.__setattr__(self, "program", program)  # not a submodule: the runner has no parameters
        object.__setattr__(self, "compiled", None)
        self.compile = (os.environ.get(NO_COMPILE_ENV) != "1") if compile is None else compile

    def _callable(self):
        if self.compiled is None:
            # Static graphs only: padded_shape bounds how many there are.
            object.__setattr__(self, "compiled", torch.compile(self.program, dynamic=False) if self.compile else self.program)
        return self.compiled

    def run(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        # deferred: a heavy import, paid only where it is used
        import torch._dynamo.config as dynamo_config

        # deferred: a heavy import, paid only where it is used
        import torch._inductor.config as inductor_config

        names = input_names(self)
        args = tuple(inputs[name].to(torch.long) for name in names)  # positional, as exported: (batch, seq) each
        batch, seq = args[0].shape
        if self.compile:
            args = self._padded(args, names, *padded_shape(batch, seq, config_sizes(self.config).max_positions))
        # Inference mode: freezing applies only without autograd, and one grad mode means no recompiles.
        with torch.inference_mode(), inductor_config.patch(freezing=True), warnings.catch_warnings(), \
                dynamo_config.patch(recompile_limit=MAX_COMPILED_SHAPES):
            # Inductor's int8 lowering copies zero points with torch.tensor(tensor) and warns once per GEMM.
            warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)
            out = self._callable()(*args)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        # Padding rows go; per-token outputs (batch, seq[, width]) lose the padded positions too.
        per_token = get_head(self.head).per_token
        return [o[:batch, :seq] if per_token and o.dim() >= 2 and o.shape[1] == args[0].shape[1] else o[:batch] for o in out]

    def _padded(self, args: tuple[torch.Tensor, ...], names: tuple[str, ...], batch: int, seq: int) -> tuple[torch.Tensor, ...]:
        """``args`` padded to (batch, seq): masked pad tokens on the right, copies of the first row below."""
        fill = {"input_ids": self.config.pad_token_id or 0}  # attention_mask and token_type_ids: 0
        padded = []
        for name, t in zip(names, args):
            t = torch.nn.functional.pad(t, (0, seq - t.shape[1]), value=fill.get(name, 0))
            padded.append(torch.cat([t, t[:1].expand(batch - t.shape[0], -1)]))
        return tuple(padded)


def load_inc(folder: ModelFolder, options: dict[str, Any]):
    """Load an ``inc-pt2e`` directory as an :class:`ExportedRunner` (compiled unless ``options["compile"]`` is False)."""
    path = folder.path
    if not (path / PT2_FILE).is_file():
        raise CompressError(f"{path} has no {PT2_FILE}; is the directory complete?")
    config, saved = folder.fresh_config(), folder.head
    check_options(path, INC_PT2E, config, saved, options)
    outputs = tuple(folder.record.get("outputs") or ("logits",))
    runner = ExportedRunner(path, config, saved, outputs, compile=options.get("compile"))
    if options.get("device") is not None:
        runner.to(options["device"])
    return with_info(runner, saved, structure_of(path), INC_PT2E, options)


# ---------------------------------------------------------------------------- torch.export archives


def check_pt2_archive(file: Path) -> None:
    """Refuse a ``.pt2`` archive whose loading could run code, before ``torch.export.load`` opens it.

    ``torch.export.load`` (torch 2.13, ``torch/export/pt2_archive/_package.py``) reads
    plain tensors as raw bytes described by JSON, but it also (a) ``torch.load``s with
    ``weights_only=False`` any weight or constant marked ``use_pickle`` (tensor
    subclasses), (b) ``pickle.loads`` "opaque" constants and rebuilds torchbind
    "custom" objects, (c) falls back to ``weights_only=False`` when the sample inputs
    do not load with ``weights_only=True`` (``_export/serde/serialize.py``), (d) reads
    legacy ``.pt`` weight files and pre-2.8 zip layouts through ``torch.load`` and
    (e) loads AOTInductor shared libraries. So: only the current archive version,
    no native code, every payload a plain tensor, sample inputs loadable with
    ``weights_only=True``.
    """
    # Imported here: torch.export.pt2_archive pulls in torch's serializer and distributed tensors, about a
    # second at every start of a process that never meets a .pt2 (every latency worker, every command).
    from torch.export.pt2_archive import constants as c

    bad = f"{file} is not a plain torch.export archive of tensors"
    try:
        archive = zipfile.ZipFile(file)
    except (OSError, zipfile.BadZipFile) as err:
        raise CompressError(f"{file} is corrupt or not a .pt2 archive ({err}); re-create the model directory") from None
    with archive:
        # Every entry sits under one root folder ("model/archive_version", ...).
        names = {name.split("/", 1)[1]: name for name in archive.namelist() if "/" in name}
        if names.get(c.ARCHIVE_VERSION_PATH) is None or archive.read(names[c.ARCHIVE_VERSION_PATH]).decode().strip() != c.ARCHIVE_VERSION_VALUE:
            raise CompressError(f"{bad}: unknown archive version; re-create it with this torch version")
        for name in names:
            if name.startswith((c.AOTINDUCTOR_DIR, c.EXECUTORCH_DIR, c.MTIA_DIR, c.XL_MODEL_WEIGHTS_DIR)):
                raise CompressError(f"{bad}: it holds compiled code ({name}), which is never loaded")
            legacy = name.startswith((c.WEIGHTS_DIR, c.CONSTANTS_DIR)) and name.endswith(".pt")
            if legacy:
                raise CompressError(f"{bad}: it holds pickled {name}, which is never loaded")
        for name, full in names.items():
            if not (name.startswith((c.WEIGHTS_DIR, c.CONSTANTS_DIR)) and name.endswith("_config.json")):
                continue
            for fqn, meta in json.loads(archive.read(full)).get("config", {}).items():
                plain = not meta.get("use_pickle") and meta.get("path_name", "").startswith(
                    (c.WEIGHT_FILENAME_PREFIX, c.TENSOR_CONSTANT_FILENAME_PREFIX)
                )
                if not plain:
                    raise CompressError(f"{bad}: {fqn} is a pickled object, which is never loaded")
        for name, full in names.items():
            if name.startswith(c.SAMPLE_INPUTS_DIR):
                try:
                    torch.load(io.BytesIO(archive.read(full)), weights_only=True)
                except Exception:
                    raise CompressError(f"{bad}: its sample inputs need unpickling, which is never done") from None


def load_exported_program(file: Path):
    """``torch.export.load`` of an archive that :func:`check_pt2_archive` accepted."""
    check_pt2_archive(file)
    with quiet_torch_ao():
        # Registers the quantized_decomposed ops PT2E graphs call (INC/torchao import it
        # when quantizing; a fresh process must too, or deserialisation fails).
        import torch.ao.quantization.fx._decomposed  # noqa: F401
    try:
        return torch.export.load(str(file))
    except Exception as err:
        raise CompressError(f"cannot load {file}: {reason(err)}; re-create it with this torch version") from None
