"""Recipes: a YAML/JSON list of stages that chains the toolkit into one reproducible study.

    name: sst2-study
    defaults: {task: sst2, data_dir: ~/glue_data}      # merged into every stage that accepts them
    stages:
      - {name: teacher, run: finetune, model: bert-base, config: {epochs: 3}}
      - {name: student, run: distill, teacher: "${teacher}", config: {student: 6L-384}}
      - {name: pruned, run: prune, model: "${student}", config: {remove_heads: 0.5}}
      - {name: int8, run: quantize, model: "${pruned}", config: {backend: onnxruntime}}
      - {name: latency, run: latency, models: ["${teacher}", "${student}", "${pruned}", "${int8}"]}

``run_recipe(recipe, run_dir)`` validates every stage's config into that stage's frozen
dataclass before anything runs (unknown keys, wrong types and missing inputs are
reported with the stage's name), then runs the stages in order, each into
``run_dir/<name>/``. ``manifest.json`` records a hash of each stage's kind, resolved
config and inputs (input directories hashed by content): a re-run skips stages whose
hash is unchanged and re-runs a changed stage and, through the hashes, everything that
depends on it. It stores the resolved config too, so an option the toolkit gained since
a stage ran, left at its default, does not re-run the stage (:func:`stands`; a new
option's default must therefore do what the toolkit did before it). A stage is ``running`` in
the manifest while it runs, ``done`` after, or ``failed`` with the reason (its error's line,
``terminated (SIGTERM)``, ``interrupted (Ctrl-C)``) when it stops otherwise, and then runs
again next time. The run directory is locked while a recipe runs in it
(:func:`compress.core.paths.output_lock`): a second recipe into it is refused at its start.
The leaderboard report of every model produced, titled with the recipe's name and listing its stages (scored
on the split of the recipe's leaderboard stage, if it has one: dev otherwise),
lands at the top of the run directory; a model the recipe did not evaluate is listed as
"not evaluated" (a recipe of one quantize stage still gets its report).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.core.formats.records import dir_hash, read_record
from compress.core.formats.schemas import STR, Inside, MapOf, Record, Schema, optional
from compress.core.formats.writes import check_writable, write_json_atomic, write_text_atomic
from compress.core.preflight import check_output
from compress.core.config import field_names, from_dict, load_file
from compress.core.errors import CompressError, foreign
from compress.core.checkpoints import fingerprint
from compress.core.paths import output_lock
from compress.core.signals import Terminated
from compress.eval.evaluate import evaluate
from compress.eval.latency.runs import measure_latency
from compress.eval.leaderboard import LeaderboardConfig
from compress.eval.report import leaderboard
from compress.stages import RECIPE_STAGES as STAGES
from compress.stages import SEVERAL
from compress.teacher.presets import HUB_ALIASES

MANIFEST = "manifest.json"
# manifest.json as _run writes it, the fields read back: stage name (a folder of the run directory) -> its last run.
MANIFEST_SCHEMA = Schema(Record({"recipe": optional(STR), "stages": MapOf(Record({
    "kind": optional(STR), "hash": optional(STR), "status": optional(STR), "inputs": optional(STR),
    "config": Record(),
}), keys=Inside())}, required=("stages",)), fix="remove it and run the recipe again with --overwrite")
REFERENCE = re.compile(r"^\$\{([A-Za-z0-9_\-]+)\}$")


def run_eval(models: list[Path], out: Path, cfg, overwrite: bool = True) -> Path:
    """Recipes' eval stage: evaluate every model (results go to each model's metrics.json too)."""
    out.mkdir(parents=True, exist_ok=True)
    results = {str(m): evaluate(m, dataclasses.replace(cfg, predictions=str(out / Path(m).name))) for m in models}
    write_json_atomic(out / "eval.json", results)
    return out


def run_latency(models: list[Path], out: Path, cfg, overwrite: bool = True) -> Path:
    """Recipes' latency stage: one latency report over all models, written into ``out``."""
    measure_latency(models, dataclasses.replace(cfg, out=str(out)))
    return out


# ---------------------------------------------------------------------------- parsing and validation


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str
    inputs: dict[str, Any]  # input name -> reference "${stage}" / path / list of those
    config: Any  # the stage's validated config dataclass
    config_refs: dict[str, str] = dataclasses.field(default_factory=dict)  # option -> "${stage}" (e.g. init: ${general})


@dataclass(frozen=True)
class Recipe:
    name: str
    stages: tuple[Stage, ...]
    report: bool  # write the leaderboard report of all produced models at the top of the run dir


VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def substitute(value: Any, variables: dict[str, str], where: str) -> Any:
    """Replace ``{{name}}`` in every string of a recipe by ``variables[name]``."""
    if isinstance(value, dict):
        return {k: substitute(v, variables, where) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, variables, where) for v in value]
    if isinstance(value, str):
        def replace(match):
            name = match.group(1)
            if name not in variables:
                raise CompressError(f"{where}: unknown variable {{{{{name}}}}}; pass --var {name}=VALUE")
            return str(variables[name])

        return VARIABLE.sub(replace, value)
    return value


def load_recipe(source: str | Path | dict, where: str | None = None, variables: dict[str, str] | None = None) -> Recipe:
    """Read and validate a recipe (file path or mapping); every error names its stage.

    ``{{name}}`` in any string is replaced from ``variables`` (``run_dir`` is always set
    by :func:`run_recipe`).
    """
    data = load_file(source) if not isinstance(source, dict) else source
    where = where or (str(source) if not isinstance(source, dict) else "recipe")
    data = substitute(data, dict(variables or {}), where)
    unknown = set(data) - {"name", "defaults", "stages", "report"}
    if unknown:
        raise CompressError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; valid: name, defaults, stages, report")
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise CompressError(f"{where}: 'stages' must be a non-empty list of stages")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise CompressError(f"{where}: 'defaults' must be a mapping of options")
    stages: list[Stage] = []
    seen: dict[str, Stage] = {}
    for i, raw in enumerate(raw_stages):
        if not isinstance(raw, dict):
            raise CompressError(f"{where}: stage {i + 1} must be a mapping with name, run and config")
        name = str(raw.get("name") or f"stage{i + 1}")
        label = f"{where}: stage '{name}'"
        if name in seen:
            raise CompressError(f"{label}: the name is used twice; stage names must be unique")
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
            raise CompressError(f"{label}: use letters, digits, '-' and '_' in stage names")
        if "run" not in raw:
            raise CompressError(f"{label}: missing 'run' (one of {', '.join(STAGES.names())})")
        try:
            kind = STAGES.get(str(raw["run"]))
        except CompressError as err:
            raise CompressError(f"{label}: {err}") from None
        keys = [i.key for i in kind.inputs]
        extra = set(raw) - {"name", "run", "config", *keys}
        if extra:
            valid = ", ".join(["name", "run", "config", *keys])
            raise CompressError(f"{label}: unknown key(s) {', '.join(sorted(extra))}; valid for {raw['run']}: {valid}")
        inputs = {}
        for key in keys:
            if key not in raw:
                raise CompressError(f"{label}: missing input '{key}' (a directory, a hub name, or ${{stage}})")
            inputs[key] = _check_inputs(raw[key], key, seen, label)
        cls = kind.config_class()
        allowed = set(_field_names(cls))
        merged = {k: v for k, v in defaults.items() if k.replace("-", "_") in allowed}
        config = raw.get("config") or {}
        if not isinstance(config, dict):
            raise CompressError(f"{label}: 'config' must be a mapping of options")
        merged.update(config)
        # An option may name an earlier stage's output (distill's init: ${general}); resolved when the stage runs.
        refs = {k: v for k, v in config.items() if isinstance(v, str) and REFERENCE.match(v)}
        for key, value in refs.items():
            _check_inputs(value, key, seen, label)
        cfg = from_dict(cls, merged, label)
        stage = Stage(name, str(raw["run"]), inputs, cfg, refs)
        stages.append(stage)
        seen[name] = stage
    return Recipe(str(data.get("name") or Path(str(where)).stem), tuple(stages), bool(data.get("report", True)))


def _field_names(cls) -> list[str]:
    return field_names(cls)


def _check_inputs(value: Any, key: str, seen: dict[str, Stage], label: str) -> Any:
    many = key in SEVERAL
    values = value if isinstance(value, list) else [value]
    if not many and isinstance(value, list):
        raise CompressError(f"{label}: '{key}' takes one input, got a list")
    for v in values:
        m = REFERENCE.match(str(v))
        if m:
            ref = m.group(1)
            if ref not in seen:
                raise CompressError(f"{label}: '{key}' refers to ${{{ref}}}, which is not an earlier stage")
            if not STAGES.get(seen[ref].kind).produces_model and key != "runs":
                raise CompressError(f"{label}: '{key}' refers to ${{{ref}}}, a {seen[ref].kind} stage that produces no model")
    return values if many else value


# ---------------------------------------------------------------------------- running


def _resolve(value: Any, run_dir: Path) -> Any:
    if isinstance(value, list):
        return [_resolve(v, run_dir) for v in value]
    m = REFERENCE.match(str(value))
    return run_dir / m.group(1) if m else value


def _input_digest(value: Any, run_dir: Path, manifest: dict) -> Any:
    """What an input contributes to a stage's hash: an upstream stage's hash, or a directory's content."""
    if isinstance(value, list):
        return [_input_digest(v, run_dir, manifest) for v in value]
    m = REFERENCE.match(str(value))
    if m:
        return manifest.get(m.group(1), {}).get("hash")
    path = Path(str(value)).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return dir_hash(path)
    return str(value)  # a hub name: its revision is pinned by the cache


def stage_hash(stage: Stage, inputs_digest: Any) -> str:
    return fingerprint(stage.kind, dataclasses.asdict(stage.config), inputs_digest)


def _config_record(config) -> dict:
    """A stage's resolved config as the manifest stores it (JSON values: tuples become lists, paths strings)."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def stands(done: dict, stage: Stage, digest: str, inputs: str) -> bool:
    """Whether a finished stage's output still holds for ``stage``: the same hash, or the same inputs and config
    but for options the toolkit gained since the stage ran, each at its default (an upgrade that adds an option
    re-runs nothing). A changed value, a removed option or a new option set otherwise re-runs it."""
    if done.get("status") != "done" or done.get("kind") != stage.kind:
        return False
    if done.get("hash") == digest:
        return True
    if "config" not in done or done.get("inputs") != inputs:  # a manifest older than the stored config
        return False
    before, now = flat_options(done["config"]), flat_options(_config_record(stage.config))
    default = flat_options(_config_record(type(stage.config)()))
    if set(before) - set(now):  # an option the stage ran with is gone
        return False
    return all(before[k] == v if k in before else v == default.get(k) for k, v in now.items())


def flat_options(config: dict) -> dict:
    """A config record's options by their flat names, as flags and recipe keys name them: a block nested in the
    config (``train``, ``data``, the student ``shape``) adds its options, not its own name, so moving an option
    into or out of a block changes nothing a manifest compares."""
    flat = {}
    for key, value in config.items():
        flat.update(flat_options(value) if isinstance(value, dict) else {key: value})
    return flat


def run_recipe(
    recipe: Recipe | str | Path | dict, run_dir: str | Path, *, variables: dict[str, str] | None = None,
    overwrite: bool = False, say=print,
) -> Path:
    """Run ``recipe`` into ``run_dir``: skip unchanged stages, re-run changed ones and what follows.

    ``overwrite`` re-runs every stage, replacing its output, even when unchanged.
    """
    run_dir = Path(run_dir).absolute()
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, variables={"run_dir": str(run_dir), **(variables or {})})
    run_dir = check_writable(run_dir, "the recipe's run directory", "choose another --out")  # a link followed
    with output_lock(run_dir):  # a second recipe into this run directory is refused while this one runs
        return _run(recipe, run_dir, overwrite, say)


def _run(recipe: Recipe, run_dir: Path, overwrite: bool, say) -> Path:
    """:func:`run_recipe`'s body, with the run directory locked."""
    for stage in recipe.stages:  # every outside input is checked before anything is written or run
        for key, value in stage.inputs.items():
            resolved = _resolve(value, run_dir)
            for path in resolved if isinstance(resolved, list) else [resolved]:
                if not isinstance(path, Path):  # upstream outputs are checked when their consumer starts
                    _check_exists(path, stage, key)
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = run_dir / MANIFEST
    previous = read_record(manifest_path, MANIFEST_SCHEMA)["stages"] if manifest_path.is_file() else {}
    for stage in recipe.stages:  # a stage re-runs into its own folder: never an input, never one the recipe did not make
        out = run_dir / stage.name
        if out.exists():
            check_output(out, overwrite=True, inputs=([_resolve(v, run_dir) for v in stage.inputs.values()], stage.config))
            if stage.name not in previous and not overwrite and (not out.is_dir() or any(out.iterdir())):
                raise CompressError(f"recipe stage '{stage.name}': {out} exists and was not made by this recipe; "
                                    "pass --overwrite to replace it or choose another --out")
    outcome: dict[str, str] = {}  # stage name -> what this run did with it, for the report
    for stage in recipe.stages:
        inputs = {k: _resolve(v, run_dir) for k, v in stage.inputs.items()}
        for key, value in inputs.items():
            for path in value if isinstance(value, list) else [value]:
                _check_exists(path, stage, key)
        inputs_digest = {k: _input_digest(v, run_dir, previous) for k, v in {**stage.inputs, **stage.config_refs}.items()}
        digest, inputs_hash = stage_hash(stage, inputs_digest), fingerprint(inputs_digest)
        out = run_dir / stage.name
        done = previous.get(stage.name, {})
        if not overwrite and out.exists() and stands(done, stage, digest, inputs_hash):
            say(f"[{stage.name}] unchanged, skipped")
            outcome[stage.name] = "unchanged, skipped"
            continue
        say(f"[{stage.name}] running {stage.kind}")
        start = time.monotonic()
        previous[stage.name] = {"kind": stage.kind, "hash": digest, "status": "running"}
        write_json_atomic(manifest_path, {"recipe": recipe.name, "stages": previous})
        config = stage.config
        if stage.config_refs:
            config = dataclasses.replace(config, **{k: str(_resolve(v, run_dir)) for k, v in stage.config_refs.items()})
            for key, value in stage.config_refs.items():
                _check_exists(_resolve(value, run_dir), stage, key)
        if out.exists():  # checked above: the recipe's own folder, or --overwrite
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        try:
            STAGES.get(stage.kind).run_in_recipe(inputs, config, out)
        except BaseException as err:  # the manifest says why the stage stopped; the next run runs it again
            previous[stage.name] = {"kind": stage.kind, "hash": digest, "status": "failed", "reason": failure(err),
                                    "seconds": round(time.monotonic() - start, 1)}
            with contextlib.suppress(CompressError, OSError):  # a full disk: the stage's own error is the one to say
                write_json_atomic(manifest_path, {"recipe": recipe.name, "stages": previous})
            raise
        previous[stage.name] = {"kind": stage.kind, "hash": digest, "status": "done", "seconds": round(time.monotonic() - start, 1),
                                "inputs": inputs_hash, "config": _config_record(stage.config)}
        outcome[stage.name] = f"ran ({previous[stage.name]['seconds']:g} s)"
        write_json_atomic(manifest_path, {"recipe": recipe.name, "stages": previous})
    models = [run_dir / s.name for s in recipe.stages if STAGES.get(s.kind).produces_model]
    if recipe.report and models:
        # The table's latency column is read at the point the recipe's own latency stage measured, its scores on
        # the split of the recipe's own leaderboard stage (a user's task scored on its test file: test).
        timed = next((s.config for s in recipe.stages if s.kind == "latency"), None)
        point = {"batch": timed.batch[0], "seq": timed.seq[0]} if timed else {}
        board = next((s.config for s in recipe.stages if s.kind == "leaderboard"), None)
        split = {"split": board.split} if board else {}
        # Every model the recipe made is listed, measured or not: the report shows what the recipe measured.
        leaderboard(models, run_dir / "report", LeaderboardConfig(**point, **split), overwrite=True, keep_unmeasured=True,
                    title=f"Recipe {recipe.name}", sections=[("Stages", stage_list(recipe, outcome))])
        # A copy at the top of the run; the HTML inlines its images, the Markdown's links now point into report/.
        if (run_dir / "report" / "report.html").is_file():
            shutil.copy2(run_dir / "report" / "report.html", run_dir / "report.html")
        text = (run_dir / "report" / "report.md").read_text(encoding="utf-8")
        for image in (run_dir / "report").glob("*.png"):
            text = text.replace(f"]({image.name})", f"](report/{image.name})")
        write_text_atomic(run_dir / "report.md", text)
    return run_dir


def failure(err: BaseException) -> str:
    """Why a stage stopped, as its manifest entry says it: the error's own line, or what stopped the process."""
    if isinstance(err, Terminated):
        return "terminated (SIGTERM)"
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(err, CompressError):
        return str(err)
    message = foreign(err)  # a runtime's whole message: its first line may only say where it rethrew
    return type(err).__name__ + (f": {message}" if message else "")


def stage_list(recipe: Recipe, outcome: dict[str, str]) -> str:
    """The recipe's stages as a Markdown table: name, kind, inputs and what this run did."""
    def shown(value: Any) -> str:
        values = value if isinstance(value, list) else [value]
        return ", ".join(f"`{v}`" for v in values)

    lines = ["| stage | run | inputs | this run |", "|---|---|---|---|"]
    for stage in recipe.stages:
        inputs = "; ".join(f"{key}: {shown(value)}" for key, value in stage.inputs.items()) or "—"
        lines.append(f"| {stage.name} | {stage.kind} | {inputs} | {outcome.get(stage.name, 'not run')} |")
    return "\n".join(lines)


def _check_exists(path: Any, stage: Stage, key: str) -> None:
    """Inputs must exist before a stage starts: an upstream output, a directory, or a hub name."""
    if isinstance(path, Path):  # an upstream stage's output
        if not path.exists():
            raise CompressError(f"recipe stage '{stage.name}': input '{key}' {path} was not produced")
        return
    text = str(path)
    if Path(text).expanduser().exists():
        return
    if text.lower() in HUB_ALIASES or (text.count("/") == 1 and not text.startswith((".", "/", "~"))):
        return  # resolved (and checked) by the stage itself
    raise CompressError(f"recipe stage '{stage.name}': input '{key}' {text} does not exist and is not a hub model name")
