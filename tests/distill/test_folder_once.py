"""A task distillation opens its teacher's folder once and passes the record on.

A profiler follows every call into the package whose arguments hold the teacher's path, or a record whose
``.path`` is it, and counts how often each module is entered (consecutive calls inside one module count once): a
module entered again and again is one re-reading the folder through a helper of its own. Beside it, every file under
the teacher folder that the package opens itself is counted, and the weights, tokenizer and config loads.
"""

from __future__ import annotations

import builtins
import io
import sys
from collections import Counter
from pathlib import Path

import pytest
import transformers

from compress.core.config import from_dict
from compress.core.data import synthetic
from compress.core.formats import artifacts, folder
from compress.distill.task import DistillConfig, distill
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

MAX_ENTRIES = 4
LIBRARIES = ("transformers", "tokenizers", "huggingface_hub", "safetensors", "torch", "datasets")


def holds(value, target: str, depth: int = 0) -> bool:
    """Whether a call's argument is the folder's path, or a list or record holding it (one level down)."""
    if isinstance(value, (str, Path)):
        try:
            return str(Path(value).resolve()) == target or str(value) == target
        except (OSError, ValueError):
            return False
    if depth < 1 and isinstance(value, (list, tuple)):
        return any(holds(v, target, depth + 1) for v in value)
    if depth < 1 and hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        return any(holds(getattr(value, f, None), target, depth + 1) for f in value.__dataclass_fields__)
    if depth < 1 and hasattr(value, "path") and not isinstance(value, type):
        return holds(value.path, target, depth + 1)
    return False


def module_entries(calls: list[tuple[str, str]]) -> Counter:
    """How often each module is entered: consecutive calls inside one module count once."""
    return Counter(m for i, (m, _) in enumerate(calls) if i == 0 or calls[i - 1][0] != m)


def opener(frame) -> str:
    """Who opens a file: the first frame up the stack in the package or in one of the libraries it calls."""
    while frame is not None:
        top = frame.f_globals.get("__name__", "").split(".")[0]
        if top == "compress" or top in LIBRARIES:
            return top
        frame = frame.f_back
    return "other"


@pytest.fixture
def teacher(tmp_path):
    """A tiny sst2 classifier (its compression.json names the task), the generated sst2 data, the config."""
    data = synthetic.write_sst2_layout(tmp_path / "data", n_train=48, n_dev=16, n_test=4)
    model_dir = save_tiny(make_tiny_model(), make_tokenizer(tmp_path / "tok"), tmp_path / "teacher", extra={"task": "sst2"})
    cfg = from_dict(DistillConfig, {"student": "1L-32", "heads": 4, "ffn": 32, "init": "teacher-slices", "data_dir": str(data),
                                    "epochs": 1, "seed": 3, "augment": 1, "cache_dir": str(tmp_path / "cache")})
    return model_dir, cfg


@pytest.mark.e2e
def test_distill_opens_its_teacher_once(teacher, tmp_path, monkeypatch):
    model_dir, cfg = teacher
    target = str(Path(model_dir).resolve())
    calls: list[tuple[str, str]] = []
    opened: Counter = Counter()
    loads: Counter = Counter()

    def profile(frame, event, arg):
        name = frame.f_globals.get("__name__", "")
        if event != "call" or not name.startswith("compress"):
            return
        code = frame.f_code
        args = [frame.f_locals.get(v) for v in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
        if any(holds(a, target) for a in args):
            calls.append((name, code.co_name))

    real_open = io.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and str(Path(file).resolve().parent) == target:
            opened[(Path(file).name, opener(sys._getframe(1)))] += 1
        return real_open(file, *args, **kwargs)

    def counting(name, load):
        def wrapped(source, *args, **kwargs):
            if target in str(Path(source).resolve()):
                loads[name] += 1
            return load(source, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(artifacts, "load_file", counting("weights", artifacts.load_file))
    monkeypatch.setattr(folder.AutoTokenizer, "from_pretrained", counting("tokenizer", folder.AutoTokenizer.from_pretrained))
    monkeypatch.setattr(transformers.BertConfig, "from_pretrained", counting("config", transformers.BertConfig.from_pretrained))
    sys.setprofile(profile)
    try:
        out = distill(model_dir, tmp_path / "student", cfg)
    finally:
        sys.setprofile(None)

    assert (out / "model.safetensors").is_file()
    entered = module_entries(calls)
    assert entered["compress.core.formats.folder"] >= 1  # the tracer sees the record
    assert max(entered.values()) <= MAX_ENTRIES, entered.most_common()
    ours = {name: n for (name, who), n in opened.items() if who == "compress"}
    # config.json once (its bytes: parsed, and hashed with the weights), compression.json and metrics.json once, the
    # weights once by the hash (their tensors once by safetensors; transformers reads its own files inside one
    # tokenizer load and one config load)
    assert ours == {"config.json": 1, "compression.json": 1, "metrics.json": 1, "model.safetensors": 1}, opened
    assert loads == {"weights": 1, "tokenizer": 1, "config": 1}
