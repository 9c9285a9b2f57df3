"""Reports: a leaderboard table written as Markdown, as one self-contained HTML file, and as JSON.

``leaderboard(runs, out, cfg)`` is the stage: collect the models, build the table
(``compress.eval.leaderboard``) and write the report.

``write_report(table, out_dir, title=...)`` writes into ``out_dir`` (atomically: a
temporary sibling directory renamed into place; a non-empty ``out_dir`` is refused
unless ``overwrite``):

* ``pareto-<task>.png``: accuracy vs latency per task (``compress.eval.leaderboard_render.plot_pareto``);
* ``report.md``: the tables, their notes and the plots linked;
* ``report.html``: the same document, tables as HTML tables and the plots embedded as
  base64 data URIs, with an inline style sheet: one file that opens anywhere, offline;
* ``leaderboard.json``: every number of the table.

The HTML is rendered from ``report.md`` itself by a converter for the small Markdown
subset the report uses (headings, pipe tables, bullet lists, paragraphs, images, inline
code / bold / links), so the two files cannot disagree.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from compress.core.formats.artifacts import is_model_dir, output_dir
from compress.core.formats.records import read_compression
from compress.core.formats.writes import write_json_atomic
from compress.core.preflight import check_output
from compress.core.errors import CompressError
from compress.eval.leaderboard import LeaderboardConfig, build_table, collect, expand_runs
from compress.eval.leaderboard_render import format_markdown, plot_all

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
REPORT_JSON = "leaderboard.json"

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1200px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; }
th { background: #f3f3f3; }
tr:nth-child(even) td { background: #fafafa; }
td.r, th.r { text-align: right; }
code { background: #f3f3f3; padding: 0 0.2em; }
img { max-width: 100%; }
"""

Sections = Sequence[tuple[str, str]] | Mapping[str, str]


def write_report(table: dict[str, Any], out_dir: str | Path, *, title: str,
                 extra_sections: Sections | None = None, overwrite: bool = False) -> Path:
    """Write report.md, report.html, leaderboard.json and the Pareto plots into ``out_dir``; the directory.

    ``extra_sections`` are (heading, Markdown body) pairs appended after the tables.
    """
    with output_dir(out_dir, overwrite) as tmp:
        figures = plot_all(table, tmp)  # task -> PNG file name
        markdown = compose_markdown(table, title, figures, extra_sections)
        (tmp / REPORT_MD).write_text(markdown, encoding="utf-8")
        (tmp / REPORT_HTML).write_text(markdown_to_html(markdown, tmp, title), encoding="utf-8")
        write_json_atomic(tmp / REPORT_JSON, {**table, "title": title, "figures": figures})
    return Path(out_dir)


def compose_markdown(table: dict[str, Any], title: str, figures: Mapping[str, str],
                     extra_sections: Sections | None = None) -> str:
    """The whole report as Markdown: title, tables and notes, plots, model paths, extra sections."""
    lines = [f"# {title}", "", f"Generated {table['when']} from the models' metrics.json and compression.json; "
             "nothing was re-measured.", ""]
    if table.get("warnings"):
        lines += ["## Warnings", "", *(f"- {w}" for w in table["warnings"]), ""]
    lines.append(format_markdown(table).rstrip("\n"))
    if figures:
        lines += ["", "## Accuracy vs latency", ""]
        for task, name in figures.items():
            lines += [f"![{table['task_names'][task]}: metric vs p50 latency]({name})", ""]
        lines.append("Marker area is proportional to parameters; the red line joins the Pareto front "
                     "(no other model is both faster and better); the dashed lines, each labelled on the line, are "
                     "published results (no latency of theirs is comparable with this machine).")
    lines += ["", "## Models", "", *(f"- {m['name']}: `{m['path']}`" for m in table["models"])]
    items = extra_sections.items() if isinstance(extra_sections, Mapping) else (extra_sections or ())
    for heading, body in items:
        lines += ["", f"## {heading}", "", body.strip()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- Markdown subset -> HTML

_IMAGE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<src>[^)]+)\)$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")


def markdown_to_html(markdown: str, base_dir: Path, title: str) -> str:
    """A standalone HTML page of ``markdown``; images under ``base_dir`` are embedded as data URIs."""
    body = "\n".join(_blocks(markdown.splitlines(), Path(base_dir)))
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def _blocks(lines: list[str], base_dir: Path) -> list[str]:
    """HTML of each block: consecutive table rows, list items or paragraph lines are grouped."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line:
            i += 1
            continue
        if line.startswith("|"):
            group, i = _take(lines, i, lambda s: s.startswith("|"))
            out.append(table_html(group))
        elif line.startswith("- "):
            group, i = _take(lines, i, lambda s: s.startswith("- "))
            out.append("<ul>\n" + "\n".join(f"<li>{inline(g[2:])}</li>" for g in group) + "\n</ul>")
        elif heading := _HEADING.match(line):
            level = len(heading.group(1))
            out.append(f"<h{level}>{inline(heading.group(2))}</h{level}>")
            i += 1
        elif image := _IMAGE.match(line):
            out.append(image_html(image.group("alt"), image.group("src"), base_dir))
            i += 1
        else:
            group, i = _take(lines, i + 1, lambda s: bool(s) and not s.startswith(("|", "- ", "#", "![")))
            out.append(f"<p>{inline(' '.join([line, *group]))}</p>")
    return out


def _take(lines: list[str], start: int, belongs) -> tuple[list[str], int]:
    """The stripped lines from ``start`` while ``belongs(line)``; and the index after them."""
    end = start
    while end < len(lines) and belongs(lines[end].strip()):
        end += 1
    return [line.strip() for line in lines[start:end]], end


def _cells(row: str) -> list[str]:
    """Cells of a pipe-table row; ``\\|`` is a literal pipe inside a cell."""
    inner = row.strip()[1:-1] if row.strip().endswith("|") else row.strip()[1:]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def table_html(rows: list[str]) -> str:
    """An HTML table from Markdown pipe-table lines (header, alignment row, body)."""
    header, body = _cells(rows[0]), rows[1:]
    align = [""] * len(header)
    if body and re.fullmatch(r"[\s|:\-]+", body[0]):
        align = [' class="r"' if c.endswith(":") and not c.startswith(":") else "" for c in _cells(body[0])]
        body = body[1:]
    align += [""] * (len(header) - len(align))
    head = "".join(f"<th{a}>{inline(c)}</th>" for a, c in zip(align, header))
    rows_html = ["<tr>" + "".join(f"<td{a}>{inline(c)}</td>" for a, c in zip(align, _cells(r))) + "</tr>" for r in body]
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(rows_html) + "\n</tbody>\n</table>"


def image_html(alt: str, src: str, base_dir: Path) -> str:
    """An <img> with the PNG inlined as a base64 data URI (a plain link if the file is missing)."""
    path = base_dir / src
    if not path.is_file():
        return f'<p><a href="{html.escape(src)}">{html.escape(alt)}</a></p>'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def inline(text: str) -> str:
    """Escape HTML, then render `code`, **bold** and [links](url)."""
    text = html.escape(text, quote=True)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', text)


# ---------------------------------------------------------------------------- entry point


def leaderboard(run_dirs: Sequence[str | Path], out: str | Path, cfg: LeaderboardConfig, overwrite: bool = False, *,
                title: str = "Leaderboard", sections: Sections | None = None, keep_unmeasured: bool = False) -> Path:
    """Collect the models of ``run_dirs``, build the table and write the report to ``out``; the directory.

    ``title`` heads the report (a recipe's report is titled with the recipe); ``sections``
    are (heading, Markdown) pairs added after the tables (a recipe's list of stages);
    ``keep_unmeasured`` lists models with no evaluation or latency as "not evaluated"
    instead of leaving them out (or refusing a table of none: a recipe's report).
    """
    cfg.validate()
    check_output(out, overwrite, inputs=(run_dirs, cfg))  # before reading anything
    paths = expand_runs(run_dirs)
    for flag, extra in (("--baseline", cfg.baseline), ("--reference-model", cfg.speed_reference)):
        if extra and not is_model_dir(extra):
            raise CompressError(f"{flag} {extra} is not a model directory (a folder with config.json)")
    baseline = [Path(cfg.baseline).resolve()] if cfg.baseline else []
    reference = [Path(cfg.speed_reference).resolve()] if cfg.speed_reference else []
    # A baseline not among the runs leads the table; a speed reference not among them closes it.
    ordered = list(dict.fromkeys([*(p for p in baseline if p not in paths), *paths, *reference]))
    rows = collect(ordered, batch=cfg.batch, seq=cfg.seq, keep_unmeasured=keep_unmeasured, split=cfg.split)
    table = build_table(rows, cfg, keep_unmeasured=keep_unmeasured)
    table["warnings"] = teacher_warnings(table["models"])
    return write_report(table, out, title=title, extra_sections=sections, overwrite=overwrite)


def teacher_warnings(models: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line per model distilled from (or pruned as) a model not fine-tuned for its task, as its compression.json's
    ``teacher_check`` says (a teacher at chance on dev, with no head for the task, made for another task)."""
    lines = []
    for m in models:
        check = read_compression(m["path"]).get("teacher_check") or {}
        if check.get("problems"):
            what = "AT CHANCE" if check.get("at_chance") else "NOT FINE-TUNED for its task"
            lines.append(f"**{m['name']}** was made from a model {what} ({'; '.join(check['problems'])}): "
                         "its scores and retention mean nothing.")
    return lines


def first_table(markdown: str) -> str:
    """The first Markdown table of ``markdown`` (the report's headline), or ""."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return ""
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def summarize(out: Path, cfg: LeaderboardConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress leaderboard`` prints: the report's headline table."""
    return first_table((out / "report.md").read_text(encoding="utf-8")), []
