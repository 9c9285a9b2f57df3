"""The house decides each thing once: read from the source with ``ast`` and regular expressions.

* A model's family is decided in one adapter (``compress.core.model.encoder``): no module probes
  a layer for its family, and no module outside the adapter reads a config's family-named
  sizes (``hidden_size`` is ``dim`` in DistilBERT).
* No function is longer than 80 lines unless its docstring says it is a linear sequence of steps.
* The parts do not import each other both ways (teacher/ and students/).
* ``distill()`` reads as a few steps: the functions it calls directly come from at most 4 of any one file.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("compress", "teacher", "students", "eval")
SIZE_NAMES = r"hidden_size|num_attention_heads|num_hidden_layers|intermediate_size|n_heads|n_layers|hidden_dim|max_position_embeddings"
ADAPTER = {"compress/core/model/encoder.py", "compress/core/model/families.py"}  # where a family's names are known


def sources(*folders: str) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
            for folder in folders for p in (ROOT / folder).rglob("*.py") if "results" not in p.parts}


def test_no_module_outside_the_adapter_reads_a_configs_family_named_sizes():
    pattern = re.compile(rf"\.({SIZE_NAMES})\b|\bconfig\.vocab_size\b")
    found = [f"{path}:{n}: {line.strip()}" for path, text in sources(*PACKAGES).items() if path not in ADAPTER
             for n, line in enumerate(text.splitlines(), 1) if pattern.search(line) and not line.lstrip().startswith("#")]
    assert found == []


def test_the_family_is_decided_in_one_adapter_and_no_layer_is_probed_for_it():
    texts = sources(*PACKAGES)
    assert not [p for p, t in texts.items() if "layer_family" in t]
    calls = Counter(p for p, t in texts.items() for _ in re.finditer(r"\bfamily_of\(", t))
    calls.pop("compress/core/model/families.py", None)  # its definition and its own lookup
    # The adapter (models and configs), structure's two config-level answers for runners without modules, and the
    # artifact loader's class lookups by config (which class builds a head) read the family; nothing else does.
    assert set(calls) <= {"compress/core/model/encoder.py", "compress/core/model/structure.py", "compress/core/formats/artifacts.py"}
    assert sum(calls.values()) <= 10


def test_no_function_is_over_80_lines_unless_it_is_a_linear_sequence_of_steps():
    long = []
    for path, text in sources(*PACKAGES, "bench").items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                if "linear sequence of steps" not in (ast.get_docstring(node) or ""):
                    long.append(f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def _imported_packages(folder: str) -> set[str]:
    found = set()
    for text in sources(folder).values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("compress."):
                found.add(node.module.split(".")[1])
    return found


def test_teacher_and_students_do_not_import_each_other():
    assert "students" not in _imported_packages("teacher")
    assert "teacher" not in _imported_packages("students")


def test_distill_reads_as_a_few_steps_no_file_entered_more_than_four_times():
    """Following ``distill()``: the functions it calls, grouped by the file that defines them."""
    text = (ROOT / "compress" / "distill" / "task.py").read_text()
    tree = ast.parse(text)
    entry = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "distill")
    where = {}  # name -> defining module, from the file's own definitions and its imports
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            where[node.name] = "compress.distill.task"
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                where[alias.asname or alias.name] = node.module
    called = {n.func.id for n in ast.walk(entry) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    per_file = Counter(where[name] for name in called if name in where)
    assert per_file and max(per_file.values()) <= 4, per_file
