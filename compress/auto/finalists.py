"""``compress auto``'s step 4: the finalists quantized into every variant predicted to fit, measured, and judged.

Each finalist becomes the variants predicted to fit it, scored (an int8 or bf16 one on its own, by the search target),
and all of them are timed beside the teacher in one final run repeated ``--final-runs`` times (:func:`make_finalists`,
:func:`final_run`, :func:`measured`); when none meets every budget, the other trained candidates are timed in a second
run (:func:`second_run`). The teacher and the ``--compare`` folders are shown from the same run (:func:`compared`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from compress.auto.embedding import STATIC_VARIANT
from compress.auto.probe import make_variant, variants
from compress.auto.search import measurement
from compress.auto.state import SearchRun, best_round
from compress.auto.targets import Target
from compress.auto.variants import skipped
from compress.core.errors import CompressError
from compress.eval.latency.row import Row
from compress.eval.latency.rows import size_on_disk

log = logging.getLogger(__name__)


def make_finalists(run: SearchRun, labels: list[str], predicted: dict, *, add: bool = False) -> list[dict]:
    """Every finalist as each variant predicted to fit it, with its score (int8 measured after quantizing);
    recorded in the state as its finalists (``add``: beside those already there)."""
    search = run.search
    best = best_round(search.state["trained"].values())
    artifacts = []
    for label in labels:
        last = best[label]
        source = Path(last["dir"])
        if label not in predicted:  # the static student: no shape, so no prediction; it is its own only variant
            artifacts.append({"label": label, "variant": STATIC_VARIANT, "dir": str(source), "accuracy": float(last["score"]),
                              "teacher": last["teacher"], "predicted": None})
            continue
        for name, why in skipped(run.cfg.variant_table, run.cfg.backends, run.teacher_dir).items():
            log.warning("%s as %s: %s", label, name, why)  # e.g. CTranslate2 has no converter for the family
        for name, how in variants(run):
            if name not in predicted[label]["variants"]:
                continue
            try:
                # named by round: a resumed search that trained further never reuses the variant of an older round
                dest = search.work / "final" / f"{label}-r{last['round']}-{name}"
                path = make_variant(source, dest, how, run.target, max_eval=None)
                accuracy = variant_accuracy(path, how, run.target, last["score"])
            except CompressError as err:  # e.g. the accuracy guard refused the int8 model
                log.warning("%s as %s: %s", label, name, err)
                continue
            artifacts.append({"label": label, "variant": name, "dir": str(path), "accuracy": float(accuracy),
                              "teacher": last["teacher"], "predicted": predicted[label]["measurements"][name]})
    search.state["finalists"] = (search.state["finalists"] if add else []) + [
        {k: v for k, v in a.items() if k != "predicted"} for a in artifacts]
    search.save()
    return artifacts


def variant_accuracy(path: Path, how, target: Target, fp32: float) -> float:
    """A variant's score: an int8 or bf16 one's own (as the target scores it: see its ``variant_score``), any other
    its fp32 candidate's. An int8 export (CTranslate2's) is refused beyond --max-drop, as quantize refuses its own."""
    if how is None or (how[0] != "quantize" and how[2] not in ("bf16", "int8")):
        return fp32
    score = target.variant_score(path, how, fp32)
    if how[0] == "export" and how[2] == "int8":
        refuse_drop(path, target, fp32, score)
    return score


def refuse_drop(path: Path, target: Target, fp32: float, score: float) -> None:
    """The accuracy guard of an int8 variant no quantize run guarded: more than --max-drop below its fp32 is refused."""
    max_drop = target.cfg.max_drop
    if max_drop is not None and fp32 - score > max_drop:
        raise CompressError(f"{path.name} scores {score:.2f} ({target.score_description}), {fp32 - score:.2f} points below "
                            f"its fp32 model's {fp32:.2f}: more than --max-drop {max_drop:g}")


def final_run(run: SearchRun, dirs: list[Path]) -> list[Row]:
    """``dirs`` timed after the teacher in one run, repeated ``--final-runs`` times (twice the probe's passes)."""
    return run.timer([run.teacher_dir, *dirs], run.at, 2 * run.cfg.repeats, run.cfg.final_runs)


def second_run(run: SearchRun, finalist_labels: list[str], predicted: dict) -> list[dict]:
    """When every finalist missed a budget: every other trained candidate (most accurate first) as each variant
    predicted to fit, timed in a second final run beside the teacher. Marked ``second_run`` in the report."""
    best = best_round(run.search.state["trained"].values())
    others = sorted((c for c in best if c not in finalist_labels and predicted.get(c, {}).get("variants")),
                    key=lambda c: -best[c]["score"])
    if not others:
        return []
    log.info("no finalist met %s; timing the other candidates too: %s", "; ".join(b.text for b in run.budgets),
             ", ".join(others))
    artifacts = [{**a, "second_run": True} for a in make_finalists(run, others, predicted, add=True)]
    rows = final_run(run, [Path(a["dir"]) for a in artifacts])
    return measured(run, rows, artifacts)


def measured(run: SearchRun, rows: list[Row], artifacts: list[dict]) -> list[dict]:
    """The artifacts as measured in ``rows``: each with its name, measurement and the budgets it meets."""
    by_dir: dict[str, list[Row]] = {}
    for row in rows:
        by_dir.setdefault(row.model, []).append(row)
    out = []
    for a in artifacts:
        m = measurement(by_dir[a["dir"]], size_on_disk(Path(a["dir"])))
        out.append({**a, "name": f"{a['label']} {a['variant']}", "measurement": m,
                    "meets": {b.text: b.met(m) for b in run.budgets}})
    return out


def compared(run: SearchRun, rows: list[Row], folders: list[Path]) -> list[dict]:
    """The teacher and the ``--compare`` folders as measured in the final run: score, p50, budgets met."""
    at = run.at[0]
    out = []
    for folder in folders:
        mine = [r for r in rows if r.model == str(folder)]
        m = measurement(mine, size_on_disk(folder))
        out.append({"name": folder.name, "dir": str(folder), "accuracy": run.target.given_score(folder),
                    "measured_p50_ms": m["points"][at]["p50_ms"], "size_bytes": m["size_bytes"],
                    "meets": {b.text: b.met(m) for b in run.budgets}})
    return out
