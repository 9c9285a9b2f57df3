"""The ``torch-int8-dynamic`` format: torch.ao dynamic int8 Linear layers, quantized, written and loaded.

The int8 PyTorch layout (read by :func:`load_torch_int8`, written by
:func:`write_torch_int8`): for every quantized ``nn.Linear`` named ``NAME``,
``NAME.weight_int8`` (out, in) int8, ``NAME.weight_scale`` (out,) float64 and
``NAME.weight_zero_point`` (out,) int64 (0-d tensors for per-tensor weights),
``NAME.bias`` (out,) fp32; every other tensor as in the fp32 state dict. The file is
``model.int8.safetensors``: stock loaders find no model.safetensors and refuse the folder.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

from compress.core.errors import CompressError, reason
from compress.core.formats.architecture import build_architecture
from compress.core.formats.folder import ModelFolder
from compress.core.formats.layout import INT8_WEIGHTS_FILE, TORCH_INT8, WEIGHTS_FILE
from compress.core.formats.load_checks import check_options, with_info
from compress.core.formats.weight_checks import check_tensors
from compress.core.formats.writes import writing
from compress.core.model.structure import describe

# Suffixes of the int8 Linear tensors in the torch-int8 safetensors file.
INT8_WEIGHT, INT8_SCALE, INT8_ZERO = ".weight_int8", ".weight_scale", ".weight_zero_point"


@contextmanager
def quiet_torch_ao() -> Iterator[None]:
    """Silence torch.ao's deprecation warnings (eager dynamic quantization still works in torch 2.13)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated.*")
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated.*")
        yield


def dynamic_qconfig(per_channel: bool):
    """qint8 weights, per output channel (symmetric) or per tensor; activations quantized per batch."""
    return per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig


def quantize_linears(model, names: list[str] | None = None, *, per_channel: bool = True):
    """Replace ``nn.Linear`` layers (all, or the ``names`` given) by torch.ao dynamic int8 Linears, in place."""
    qconfig = dynamic_qconfig(per_channel)
    spec = {torch.nn.Linear: qconfig} if names is None else {name: qconfig for name in names}
    with quiet_torch_ao():
        return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)


def _quantized_linears(model) -> Iterator[tuple[str, Any]]:
    for name, module in model.named_modules():
        if isinstance(module, DynamicLinear):
            yield name, module


def int8_state_dict(model) -> dict[str, torch.Tensor]:
    """The torch-int8 layout of a dynamically quantized model (see the module docstring)."""
    state: dict[str, torch.Tensor] = {}
    linears = dict(_quantized_linears(model))
    for name, module in linears.items():
        weight = module.weight()  # quantized (out, in)
        state[name + INT8_WEIGHT] = weight.int_repr().contiguous()  # int8
        if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            state[name + INT8_SCALE] = weight.q_per_channel_scales().to(torch.float64).contiguous()  # (out,)
            state[name + INT8_ZERO] = weight.q_per_channel_zero_points().to(torch.int64).contiguous()
        else:
            state[name + INT8_SCALE] = torch.tensor(weight.q_scale(), dtype=torch.float64)
            state[name + INT8_ZERO] = torch.tensor(weight.q_zero_point(), dtype=torch.int64)
        bias = module.bias()
        if bias is not None:
            # A copy: packed params keep the float bias, which a tied head shares (MLM decoder).
            state[name + ".bias"] = bias.detach().clone()
    seen: set[int] = set()
    for key, value in model.state_dict().items():
        # Quantized Linears are stored above (their state also holds packed params and an
        # unused output scale/zero point); aliases (tied weights) are stored once.
        if not isinstance(value, torch.Tensor) or value.is_quantized or key.rpartition(".")[0].split("._packed_params")[0] in linears:
            continue
        if value.data_ptr() in seen:
            continue
        seen.add(value.data_ptr())
        state[key] = value.detach().contiguous()
    return state


def write_torch_int8(model, directory: Path) -> Path:
    """Write ``model.int8.safetensors`` in the torch-int8 layout; the file."""

    file = Path(directory) / INT8_WEIGHTS_FILE
    with writing(file):  # safetensors removes a file it failed to write and names none: said here
        save_file(int8_state_dict(model), str(file), metadata={"format": "pt", "compress_format": TORCH_INT8})
    return file


def load_torch_int8(folder: ModelFolder, options: dict[str, Any]):
    """Rebuild a torch-int8 directory: the fp32 architecture, dynamic int8 Linears, the stored int8 weights."""
    path, config, saved = folder.path, folder.fresh_config(), folder.head
    check_options(path, TORCH_INT8, config, saved, options, eager_ok=True)
    if options.get("attn_implementation"):
        config._attn_implementation = options["attn_implementation"]
    # Folders written before the int8 file had its own name hold it as model.safetensors.
    file = path / INT8_WEIGHTS_FILE if (path / INT8_WEIGHTS_FILE).is_file() or not (path / WEIGHTS_FILE).is_file() else path / WEIGHTS_FILE
    try:
        state = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as err:
        raise CompressError(f"{file} is missing or corrupt ({reason(err)}); re-create the model directory") from None
    check_tensors(state, file, integer={INT8_WEIGHT: (torch.int8,), INT8_ZERO: (torch.int64,)})
    names = sorted(k[: -len(INT8_WEIGHT)] for k in state if k.endswith(INT8_WEIGHT))
    int8_keys = {n + s for n in names for s in (INT8_WEIGHT, INT8_SCALE, INT8_ZERO)}
    model = build_architecture(path, config, saved, empty=True)
    # The fp32 tensors (embeddings, LayerNorms, biases) load as usual; quantized weights come after.
    try:
        result = model.load_state_dict({k: v for k, v in state.items() if k not in int8_keys}, strict=False)
    except RuntimeError as err:  # size mismatches
        raise CompressError(f"{file} does not match its config.json/compression.json ({reason(err)})") from None
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    quantized_weights = {n + ".weight" for n in names}
    missing = [k for k in result.missing_keys if k not in quantized_weights and k not in tied and not k.endswith("position_ids")]
    if missing or result.unexpected_keys:
        example = (missing or result.unexpected_keys)[0]
        raise CompressError(f"{file} does not match its config.json/compression.json (e.g. {example}); the directory is inconsistent")
    model.tie_weights()
    for name in names:
        # Uninitialised memory must not reach the observers; a fresh tensor, because a tied
        # decoder's weight is the word embedding matrix, which must stay as loaded.
        linear = model.get_submodule(name)
        linear.weight = torch.nn.Parameter(torch.zeros_like(linear.weight), requires_grad=False)
    quantize_linears(model, names, per_channel=state[names[0] + INT8_SCALE].dim() == 1 if names else True)
    with quiet_torch_ao():
        for name in names:
            module = model.get_submodule(name)
            module.set_weight_bias(_stored_qweight(state, name), module.bias())
    model.eval()
    model.compress_format = TORCH_INT8
    return with_info(model, saved, describe(model), TORCH_INT8, options)


def _stored_qweight(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The quantized (out, in) weight rebuilt from its int8 values, scales and zero points."""
    values, scale, zero = state[name + INT8_WEIGHT], state[name + INT8_SCALE], state[name + INT8_ZERO]
    if scale.dim() == 1:
        return torch._make_per_channel_quantized_tensor(values, scale.to(torch.float64), zero.to(torch.int64), 0)
    return torch._make_per_tensor_quantized_tensor(values, float(scale), int(zero))
