"""The house decides each thing once: read from the source with ``ast`` and regular expressions.

* A model's family is decided in one adapter (``compress.core.model.encoder``): no module probes
  a layer for its family, and no module outside the adapter reads a config's family-named
  sizes (``hidden_size`` is ``dim`` in DistilBERT).
* No file is over 800 lines, no function over 80 lines, and no function takes more than 6 positional
  parameters (more means a record is missing).
* The parts do not import each other both ways (teacher/ and students/).
* ``distill()`` reads as a few steps: the functions it calls directly come from at most 4 of any one file.
* Which precisions run here (bf16, AMX, VNNI) is decided in one record (``compress.core.hardware.Precisions``):
  no other module tests a CPU's precision flags.
* What a task head outputs and how it loads is decided in one record per head (``compress.core.model.heads``):
  no other module keeps a table keyed by head names.
* The kind of a task is decided in one record per kind (``compress.core.data.tasks.TaskKind``): no other module
  compares anything with a task kind (a constant or its string value) or keys a table by a kind constant.
* A library's or runtime's message is passed on whole, through ``compress.core.errors.foreign`` / ``reason``: no
  other module cuts an exception's text to one of its lines (OpenVINO's first line only says where it rethrew).
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


MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_POSITIONAL = 800, 80, 6


def too_big(path: str, text: str) -> list[str]:
    """What in one source breaks the size rules: the file's length, each function's length and positional parameters
    (``self`` / ``cls`` not counted; parameters after ``*`` are keyword-only and do not count; a pytest ``test_*``
    function's parameters are fixtures that pytest passes by name, so they are not counted)."""
    found = []
    lines = len(text.splitlines())
    if lines > MAX_FILE_LINES:
        found.append(f"{path}: {lines} lines")
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            found.append(f"{path}:{node.lineno} {node.name}: {length} lines")
        args = node.args.posonlyargs + node.args.args
        positional = len(args) - (1 if args and args[0].arg in ("self", "cls") else 0)
        if positional > MAX_POSITIONAL and not node.name.startswith("test_"):
            found.append(f"{path}:{node.lineno} {node.name}: {positional} positional parameters")
    return found


def test_the_size_rules_are_counted_as_stated():
    def fn(n_args: int, body_lines: int, star: bool = False) -> str:
        params = ", ".join(f"a{i}" for i in range(n_args))
        return f"def f({params}{', *, k=1' if star else ''}):\n" + "    x = 1\n" * body_lines
    assert too_big("m.py", fn(6, 79)) == []
    assert too_big("m.py", fn(7, 1)) == ["m.py:1 f: 7 positional parameters"]
    assert too_big("m.py", fn(6, 1, star=True)) == []
    assert too_big("m.py", fn(0, 80)) == ["m.py:1 f: 81 lines"]
    assert too_big("m.py", "class C:\n    def m(self, a, b, c, d, e, f):\n        pass\n") == []
    assert too_big("m.py", "x = 1\n" * 801) == ["m.py: 801 lines"]
    assert too_big("t.py", "def test_x(a, b, c, d, e, f, g):\n    pass\n") == []  # fixtures, passed by name


def test_no_file_over_800_lines_no_function_over_80_no_more_than_6_positional_parameters():
    found = [problem for path, text in sources(*PACKAGES, "bench", "tests").items() for problem in too_big(path, text)]
    assert found == []


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


def listed_modules(text: str) -> set[str]:
    """The module paths docs/architecture.md's layout block names: a folder line (``compress/auto/  what it is``)
    followed by its modules (``  run.py  what it holds``)."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    found, folder = set(), None
    for line in block.splitlines():
        if not line.strip():
            continue
        name = line.split()[0]
        if not line.startswith(" ") and name.endswith("/"):
            folder = name
        elif line.startswith("  ") and name.endswith(".py") and folder:
            found.add(folder + name)
    return found


def test_the_layout_listing_reads_folders_and_their_modules():
    text = "## Layout\n\n```\ncompress/x/   a folder\n  a.py   one\n  b.py   two\nteacher/   t\n  c.py  c\n```\n"
    assert listed_modules(text) == {"compress/x/a.py", "compress/x/b.py", "teacher/c.py"}


def test_the_architecture_page_lists_every_module_and_no_other():
    actual = {path for path in sources(*PACKAGES) if not path.endswith("__init__.py")}
    listed = listed_modules((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert sorted(actual - listed) == [] and sorted(listed - actual) == []


# CPU flags that decide which precision's kernels run (bf16, AMX, VNNI; ARM's dot products): tested in one place.
PRECISION_FLAGS = {"avx512_bf16", "amx_bf16", "amx_int8", "amx_tile", "avx512_vnni", "avx_vnni", "asimddp", "i8mm"}
# Modules that may test them: hardware.py makes the record; cpu_peaks.py is the paper peak table a latency row is
# compared to (and names a microarchitecture), and kernels.py infers which kernels fbgemm's and MLAS's own cpuid
# dispatch picked and notes a unit a row's reported kernels left unused: both describe, neither decides what runs.
FLAG_READERS = {"compress/core/hardware.py", "compress/core/cpu_peaks.py", "eval/latency/kernels.py"}
SET_METHODS = {"intersection", "issubset", "issuperset", "isdisjoint", "difference"}


def flag_tests(text: str) -> list[int]:
    """The lines of a source that test a precision flag: ``"avx512_vnni" in flags``, ``{"avx512_bf16", ...} & flags``,
    ``{"avx512_vnni", "avx512bw"} <= flags``, ``flags.intersection({...})`` (naming a preset, ``== "avx512_vnni"``,
    is no test)."""
    def names(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in PRECISION_FLAGS

    def set_naming(node) -> bool:
        return isinstance(node, (ast.Set, ast.List, ast.Tuple)) and any(names(e) for e in node.elts)

    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare):
            member = names(node.left) and isinstance(node.ops[0], (ast.In, ast.NotIn))
            subset = any(isinstance(op, (ast.LtE, ast.GtE, ast.Lt, ast.Gt)) for op in node.ops) and any(
                set_naming(o) for o in [node.left, *node.comparators])
            hit = member or subset
        elif isinstance(node, ast.BinOp):
            hit = isinstance(node.op, (ast.BitAnd, ast.Sub, ast.BitOr, ast.BitXor)) and (
                set_naming(node.left) or set_naming(node.right))
        elif isinstance(node, ast.Call):
            hit = isinstance(node.func, ast.Attribute) and node.func.attr in SET_METHODS and (
                set_naming(node.func.value) or any(set_naming(a) for a in node.args))
        else:
            hit = False
        if hit:
            found.append(node.lineno)
    return found


def test_a_flag_test_is_told_from_naming_a_preset():
    assert flag_tests('x = "avx512_vnni" in flags') == [1]
    assert flag_tests('x = "amx_bf16" not in set(f)') == [1]
    assert flag_tests('native = bool({"avx512_bf16", "amx_bf16"} & set(info["flags"]))') == [1]
    assert flag_tests('ok = {"avx512_vnni", "avx512bw"} <= flags') == [1]
    assert flag_tests('ok = flags.intersection({"amx_int8"})') == [1]
    assert flag_tests('a = preset == "avx512_vnni"\nb = {"avx512_vnni": "qint8"}\nc = "bf16" in parts') == []


def test_no_module_but_the_hardware_record_tests_a_cpus_precision_flags():
    found = [f"{path}:{n}" for path, text in sources(*PACKAGES, "bench").items() if path not in FLAG_READERS
             for n in flag_tests(text)]
    assert found == []
    # the readers still read them (a renamed module would otherwise leave a stale exemption)
    assert all(flag_tests((ROOT / path).read_text(encoding="utf-8")) for path in FLAG_READERS)


# Head names a table would be keyed by; "base" and "masked-lm" are words too common to tell a table by.
TABLE_HEADS = {"sequence-classification", "token-classification", "question-answering"}
# Where head names may be listed: the records themselves, and the family table, whose ENCODER_HEADS says which heads
# every family has a transformers class for (family data: only BERT has a pretraining class, ELECTRA no masked-LM one).
HEAD_TABLES = {"compress/core/model/heads.py", "compress/core/model/families.py"}


def head_tables(text: str) -> list[int]:
    """The lines of a source that define a table keyed by head names: a dict with a head name as a key, a tuple, list
    or set with one as an element (``head == "sequence-classification"`` or ``head="question-answering"`` names one
    head and is no table)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Dict):
            items = node.keys
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        else:
            continue
        if any(isinstance(item, ast.Constant) and item.value in TABLE_HEADS for item in items):
            found.append(node.lineno)
    return found


def test_a_head_table_is_told_from_naming_one_head():
    assert head_tables('OUTPUTS = {"sequence-classification": ("logits",), "base": ("last_hidden_state",)}') == [1]
    assert head_tables('TRAINED = ("sequence-classification", "token-classification")') == [1]
    assert head_tables('p.add_argument("--head", choices=["base", "question-answering"])') == [1]
    assert head_tables('x = head == "sequence-classification"\nm = load(d, head="question-answering")\n'
                       'KINDS = {TOKEN: TaskKind(TOKEN, "token-classification")}\nM = ("masked-lm", "pretraining")') == []


def test_no_module_but_the_head_records_keeps_a_table_keyed_by_head_names():
    found = [f"{path}:{n}" for path, text in sources(*PACKAGES, "bench").items() if path not in HEAD_TABLES
             for n in head_tables(text)]
    assert found == []
    # the family table still lists them (a renamed module would otherwise leave a stale exemption)
    assert head_tables((ROOT / "compress/core/model/families.py").read_text(encoding="utf-8"))


# The kinds of task: their constants (and the collections of them), and their string values.
KIND_NAMES = {"CLASSIFICATION", "MULTI_LABEL", "REGRESSION", "TOKEN", "SPAN", "USER_KINDS", "KINDS"}
KIND_VALUES = {"text-classification", "multi-label", "regression", "token-classification", "span"}
KIND_RECORDS = "compress/core/data/tasks.py"  # where the kinds are defined and each kind's TaskKind is made


def kind_tests(text: str) -> list[int]:
    """The lines of a source that compare anything with a task kind (``task.kind == TOKEN``, ``kind in (TOKEN, SPAN)``,
    ``problem == "regression"``) or key a table by a kind constant (``{REGRESSION: ...}``); reading a kind's record
    (``KINDS[task.kind]``, ``task.behaviour.per_token``) or naming a kind (``user_task(TOKEN, ...)``) is no test."""
    def names_kind(node) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_kind(e) for e in node.elts)
        return (isinstance(node, ast.Name) and node.id in KIND_NAMES
                or isinstance(node, ast.Attribute) and node.attr in KIND_NAMES
                or isinstance(node, ast.Constant) and node.value in KIND_VALUES)

    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare):
            hit = any(names_kind(o) for o in [node.left, *node.comparators])
        elif isinstance(node, ast.Dict):
            hit = any(isinstance(k, (ast.Name, ast.Attribute)) and names_kind(k) for k in node.keys if k is not None)
        else:
            hit = False
        if hit:
            found.append(node.lineno)
    return found


def test_a_kind_test_is_told_from_reading_a_kinds_record():
    assert kind_tests("if task.kind == TOKEN:\n    pass") == [1]
    assert kind_tests("x = kind in (TOKEN, SPAN)") == [1]
    assert kind_tests("x = tasks.SPAN is not task.kind") == [1]
    assert kind_tests('x = 1 if problem == "regression" else 2') == [1]
    assert kind_tests('ok = task.kind not in {"token-classification", "span"}') == [1]
    assert kind_tests("x = 1\nPARSERS = {CLASSIFICATION: parse_class, TOKEN: parse_tag}") == [2]
    assert kind_tests('b = KINDS[task.kind]\nt = task.behaviour.per_token\nu = user_task(TOKEN, "x")\n'
                      'h = {"token-classification": 1}\nn = name != recorded.kind\np = kind.prediction == "tags"') == []


def test_no_module_but_the_task_records_compares_a_task_kind():
    found = [f"{path}:{n}" for path, text in sources(*PACKAGES, "bench").items() if path != KIND_RECORDS
             for n in kind_tests(text)]
    assert found == []
    # the records still decide by kind (a renamed module would otherwise leave a stale exemption)
    assert kind_tests((ROOT / KIND_RECORDS).read_text(encoding="utf-8"))


ERROR_TEXT = "compress/core/errors.py"  # where an exception's text is made into one line


def cut_messages(text: str) -> list[int]:
    """The lines of a source that take some lines of an exception's text: ``str(err).splitlines()`` (stripped or not),
    ``str(err).split("\\n")`` or ``str(err).partition("\\n")``, whatever the variable is called."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("splitlines", "split", "partition")):
            continue
        if node.func.attr != "splitlines" and not (node.args and isinstance(node.args[0], ast.Constant)
                                                    and node.args[0].value == "\n"):
            continue
        receiver = node.func.value
        while isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) and receiver.func.attr == "strip":
            receiver = receiver.func.value
        if (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "str"
                and len(receiver.args) == 1 and isinstance(receiver.args[0], ast.Name)):
            found.append(node.lineno)
    return found


def test_a_cut_message_is_told_from_splitting_other_text():
    assert cut_messages("x = str(err).splitlines()[0]") == [1]
    assert cut_messages("x = (str(exc).strip().splitlines() or ['?'])[0]") == [1]
    assert cut_messages('x = 1\ny = str(e).split("\\n")[0]\nz = str(e).partition("\\n")[0]') == [2, 3]
    assert cut_messages('a = text.splitlines()\nb = str(err).split(",")\nc = report.read_text().splitlines()\n'
                        'd = str(path).split("/")') == []


def test_no_module_but_the_error_text_cuts_a_librarys_message():
    found = [f"{path}:{n}" for path, text in sources(*PACKAGES).items() if path != ERROR_TEXT
             for n in cut_messages(text)]
    assert found == []
