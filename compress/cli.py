"""The ``compress`` command: a thin shell built from the registry in :mod:`compress.stages`.

A stage's subcommand has its inputs, ``--out`` and ``--overwrite``, ``--config`` and one
flag per config field; it parses them into the stage's frozen config, makes one library
call and prints what the stage reports. Every command also takes ``--quiet`` and
``--log-level`` (:mod:`compress.core.logs`): progress goes to stderr as log lines (and
bars on a terminal), the result to stdout and its closing notes to stderr, which
``--quiet`` keeps. Libraries are imported only when a stage runs: its config lives in a
light module (``Stage.config``), so ``compress --help``, ``compress CMD --help`` and an
option its config refuses (a seed out of range, 100000 threads) are instant, and a stage's
cheap checks (:mod:`compress.core.preflight`: a missing model folder or data file, an
unknown task, a malformed budget, an occupied ``--out``) come before its module is imported, as
does reading and checking its task's data files (:mod:`compress.core.data.check`), which the stage
then reuses. A :class:`CompressError` becomes one line on stderr
and its exit status; any other exception one line naming its type and message, exit
status 1 (with ``--debug`` or ``COMPRESS_DEBUG=1`` it propagates, traceback and all); a
group or ``compress`` without its command prints its help and one error line, exit status
2; Ctrl-C exits with 130 and SIGTERM with 143, each after removing what the run was writing
(:mod:`compress.core.signals`); a closed stdout ends the command quietly. A run holds a lock
on each ``--out`` it checks (:mod:`compress.core.paths`) until it ends.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap

from compress import __version__
from compress.core import logs, paths, preflight, signals
from compress.core.config import add_arguments, from_args
from compress.core.errors import CompressError, foreign
from compress.core.data.tasks import task_choices
from compress.stages import COMMANDS, SEVERAL, Command, Stage

PROG = "compress"
GROUPS = {"teacher": "build the teacher: pretrain a BERT from scratch (MLM+NSP) or fine-tune one on a task"}
SIGPIPE_EXIT = 141  # what a shell reports for a writer whose reader went away (128 + SIGPIPE)
INTERNAL_EXIT = 1  # an exception that is not a CompressError: a bug, or the machine (disk, memory)
USAGE_EXIT = 2  # argparse's status for a usage error
DEBUG_ENV = "COMPRESS_DEBUG"  # set (not "0"): an unexpected exception shows its traceback, as --debug does

log = logging.getLogger(__name__)


class StdoutClosed(Exception):
    """The reader of stdout went away (``compress tasks | head -2``)."""


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit cannot fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def usage_error(prog: str, message: str) -> str:
    """The one line of a usage error, pointing at ``prog --help``."""
    return f"{prog}: error: {message} (see {prog} --help)"


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line that points at --help, and help survives a closed pipe."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(USAGE_EXIT, usage_error(self.prog, message) + "\n")

    def _print_message(self, message: str, file=None) -> None:
        try:
            super()._print_message(message, file)
            (file or sys.stderr).flush()
        except BrokenPipeError:
            _silence_stdout()


def _formatter(prog):
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=34, width=100)


def _print(text: str) -> None:
    """Print to stdout now, so that a reader that went away shows here and not at exit."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        raise StdoutClosed from None


def _say(message: str) -> None:
    """A closing note (where the output went): on stderr, also with --quiet."""
    print(message, file=sys.stderr)


def logging_arguments(p: argparse.ArgumentParser) -> None:
    """--quiet, --log-level and --debug, on every command (and before it: ``compress --quiet run ...``).

    Their defaults are suppressed so that a subcommand's parser never resets what the
    top-level one read; :func:`main` supplies them.
    """
    group = p.add_argument_group("output")
    group.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help="print only errors and the result: no progress bars, no log lines")
    group.add_argument("--log-level", choices=list(logs.LEVELS), default=argparse.SUPPRESS,
                       help="the toolkit's log level (default: info); other libraries stay at warning unless debug")
    group.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help=f"on an internal error, show the full traceback instead of one line (also: {DEBUG_ENV}=1)")


# ---------------------------------------------------------------------------- commands


def stage_arguments(p: argparse.ArgumentParser, stage: Stage) -> None:
    """A stage's flags: its inputs, --out and --overwrite, its switches, --config, one per config field."""
    for i in stage.inputs:
        several = i.name in SEVERAL  # --model A B and --model A --model B alike: a repeated flag adds, never replaces
        p.add_argument(i.flag, dest=i.name, required=True, nargs="+" if several else None, action="extend" if several else "store",
                       metavar=i.metavar, help=i.help)
    if stage.out_help:
        p.add_argument("--out", required=True, metavar="DIR", help=stage.out_help)
        p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    for switch in stage.switches:
        p.add_argument(switch.flag, action="store_true", help=switch.help)
    p.add_argument("--config", metavar="FILE", help="YAML/JSON file with options; flags given here override it")
    add_arguments(p, stage.config_class(), skip=stage.skip)


def early_check(stage: Stage, argv: list[str]) -> None:
    """Refuse now what ``stage`` would refuse first, before the parser imports its module (torch): compress.core.preflight.

    ``argv`` is what follows the command's name. Only the flags the checks read are parsed,
    by their exact names; a check fed by a flag that another word could abbreviate (argparse
    would take it so) is left to the stage, as is everything when --help is asked for.
    """
    if any(_asks_for_help(word) for word in argv):
        return
    parser, actions = _early_parser(stage)
    args, rest = parser.parse_known_args(argv)
    given = {word.split("=", 1)[0] for word in rest if word.startswith("--") and len(word) > 2}
    unsure = {a.dest for a in actions for flag in a.option_strings if any(flag.startswith(g) for g in given)}
    if "config" in unsure:  # the file's options are unknown
        return
    options = preflight.file_options(args.config, stage.early) if args.config else {}
    options = {name: getattr(args, name) if getattr(args, name) is not None else options.get(name)
               for name in stage.early if name not in unsure}
    models = [(i.check, getattr(args, i.name)) for i in stage.inputs
              if i.check and getattr(args, i.name) is not None and i.name not in unsure]
    out = args.out if stage.out_help and not unsure & {"out", "overwrite", "resume"} else None
    preflight.check_command(options, models, out, overwrite=bool(getattr(args, "overwrite", False)))


def _asks_for_help(word: str) -> bool:
    """--help or a prefix argparse takes for it, -h, or short flags that include it (-qh): the help comes first."""
    if word.startswith("--"):
        return len(word) > 2 and "--help".startswith(word)
    return word.startswith("-") and "h" in word


def _early_parser(stage: Stage) -> tuple[Parser, list[argparse.Action]]:
    """A parser of the flags :func:`early_check` reads, declared as the full parser declares them but none required."""
    p = Parser(prog=f"{PROG} {stage.command}", add_help=False, allow_abbrev=False)
    actions = []
    for i in stage.inputs:
        several = i.name in SEVERAL
        actions.append(p.add_argument(i.flag, dest=i.name, nargs="+" if several else None,
                                      action="extend" if several else "store"))
    if stage.out_help:
        actions += [p.add_argument("--out"), p.add_argument("--overwrite", action="store_true")]
    actions.append(p.add_argument("--config"))
    for name in stage.early:  # --task's choices refuse an unknown task in argparse's words, as the full parser does
        kwargs: dict = {"choices": task_choices()} if name == "task" else {}
        if name == "resume":
            kwargs["action"] = argparse.BooleanOptionalAction
        actions.append(p.add_argument("--" + name.replace("_", "-"), dest=name, **kwargs))
    return p, actions


def run_stage(stage: Stage, args: argparse.Namespace) -> tuple[str, list[str]]:
    """Config from --config and the flags, one call of the stage's entry; what the stage reports.

    The task data the stage reads first (``Stage.reads``) is read and checked before its module is imported, and the
    stage's own reads of it get what was read then (:mod:`compress.core.data.check`).
    """
    cfg = from_args(stage.config_class(), args, args.config)
    inputs = {i.name: getattr(args, i.name) for i in stage.inputs}
    switches = frozenset(s.name for s in stage.switches if getattr(args, s.name))
    with stage.data_checked(cfg, inputs):
        result = stage.run(inputs, cfg, args.out if stage.out_help else None,
                           overwrite=getattr(args, "overwrite", False), switches=switches)
    return stage.outcome(result, cfg, inputs)


def run_command(entry: Stage | Command, args: argparse.Namespace) -> int:
    """Run the command the flags name; its summary goes to stdout, its notes to stderr."""
    text, notes = run_stage(entry, args) if isinstance(entry, Stage) else entry.run(vars(args), log.info)
    if text:
        _print(text)
    for note in notes:
        _say(note)
    return 0


# ---------------------------------------------------------------------------- main


def _command_start(argv: list[str]) -> int:
    """Where the command's name starts in ``argv``: after --quiet / --log-level X / --debug."""
    start = 0
    while start < len(argv) and argv[start].startswith("-"):
        start += 2 if argv[start] == "--log-level" else 1
    return start


def selected_command(argv: list[str]) -> str | None:
    """The command named by the leading words of ``argv`` (e.g. "teacher finetune"), after --quiet / --log-level X / --debug."""
    start = _command_start(argv)
    words = [w for w in argv[start : start + 2] if not w.startswith("-")]
    return next((" ".join(words[:n]) for n in (2, 1) if " ".join(words[:n]) in COMMANDS), None)


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with ``selected``, only that command's options are built (and imported)."""
    parser = Parser(
        prog=PROG,
        formatter_class=_formatter,
        description=textwrap.dedent(
            """\
            Turn a big BERT into small, fast, measured students.

            Every stage reads a model directory and writes a model directory (Hugging Face
            files + compression.json + metrics.json). Run `compress COMMAND --help` for the
            options and examples of each command."""
        ),
        epilog="examples:\n  compress tasks\n  compress eval --model models/sst2 --task sst2 --data-dir ~/glue_data\n"
        "  compress latency --model models/teacher models/student --batch 1,32 --seq 128",
    )
    parser.add_argument("--version", action="version", version=f"compress {__version__}")
    logging_arguments(parser)
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    groups: dict[str, argparse._SubParsersAction] = {}
    for name, entry in COMMANDS.items():
        words = name.split()
        target = subs
        if len(words) == 2:  # "teacher finetune": a group with its own subcommands
            if words[0] not in groups:
                group = subs.add_parser(
                    words[0], help=GROUPS[words[0]], description=GROUPS[words[0]] + ".", formatter_class=_formatter,
                )
                groups[words[0]] = group.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", parser_class=Parser)
                group.set_defaults(entry=None, group_parser=group)
            target = groups[words[0]]
        sub = target.add_parser(
            words[-1], help=entry.summary, description=entry.summary[0].upper() + entry.summary[1:] + ".",
            epilog="examples:\n" + entry.examples, formatter_class=_formatter,
        )
        if selected in (None, name):  # a stage's flags import its config module: only for the command being run
            if isinstance(entry, Stage):
                stage_arguments(sub, entry)
            else:
                entry.add(sub)
        logging_arguments(sub)
        sub.set_defaults(entry=entry, command=name)
    return parser


def missing_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``compress`` or a group (``compress teacher``) without its command: its help, one error line; status 2."""
    group = getattr(args, "group_parser", None)
    if group is None:
        parser.print_help()
        message = "choose a command"
    else:
        group.print_help()
        names = [name.split()[1] for name in COMMANDS if name.split()[0] == args.command]
        message = f"choose a subcommand: {', '.join(names)}"
    sys.stdout.flush()  # the help first, then the error line, also when both go to one terminal
    print(usage_error((group or parser).prog, message), file=sys.stderr)
    return USAGE_EXIT


def debugging(args: argparse.Namespace | None, argv: list[str]) -> bool:
    """Whether an unexpected exception should propagate with its traceback: --debug or COMPRESS_DEBUG=1."""
    if os.environ.get(DEBUG_ENV, "").strip() not in ("", "0"):
        return True
    return getattr(args, "debug", False) if args is not None else "--debug" in argv


def internal_error(prefix: str, err: BaseException) -> str:
    """The one line for an exception that is not a CompressError: what failed, and how to see more."""
    message = foreign(err)  # every line that says something: a runtime's first line may only say where it rethrew
    what = type(err).__name__ + (f": {message}" if message else "")
    # An OSError (disk full, permission denied) is the machine's, not a bug of the toolkit.
    kind = "" if isinstance(err, OSError) else "an internal error; "
    return f"{prefix}: error: {what} ({kind}rerun with --debug for the traceback)"


def main(argv: list[str] | None = None) -> int:
    """Run ``compress`` with ``argv`` (default: the process's arguments); the exit status.

    Usage errors leave through argparse (SystemExit 2); every other failure is one line on
    stderr and an exit status, unless --debug / COMPRESS_DEBUG=1 lets an unexpected one
    propagate with its traceback.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    selected = selected_command(argv)
    # SIGTERM unwinds like Ctrl-C (temporary outputs removed); the --out folders checked are locked until the end.
    with signals.stop_cleanly(), paths.output_locks():
        return _main(argv, selected)


def _main(argv: list[str], selected: str | None) -> int:
    """:func:`main`'s body: the command run, every failure turned into one line and an exit status."""
    args: argparse.Namespace | None = None
    try:
        entry = COMMANDS.get(selected) if selected else None
        if isinstance(entry, Stage):  # a wrong path or name is said in a blink, not after the stage's imports
            early_check(entry, argv[_command_start(argv) + len(entry.command.split()):])
        parser = build_parser(selected or "")
        args = parser.parse_args(argv)
        if not getattr(args, "entry", None):
            return missing_command(parser, args)
        with logs.configured(getattr(args, "log_level", "info"), quiet=getattr(args, "quiet", False)):
            return run_command(args.entry, args)
    except CompressError as err:
        print(f"{_prefix(args, selected)}: error: {err}", file=sys.stderr)
        return err.exit_code
    except signals.Terminated:
        print(f"{_prefix(args, selected)}: terminated", file=sys.stderr)
        return signals.TERMINATED_EXIT
    except KeyboardInterrupt:
        print(f"{_prefix(args, selected)}: interrupted", file=sys.stderr)
        return 130
    except (StdoutClosed, BrokenPipeError):
        _silence_stdout()
        return SIGPIPE_EXIT
    except Exception as err:
        if debugging(args, argv):
            raise
        print(internal_error(_prefix(args, selected), err), file=sys.stderr)
        return INTERNAL_EXIT


def _prefix(args: argparse.Namespace | None, selected: str | None) -> str:
    """"compress eval": the program and the command being run, as far as it is known."""
    name = getattr(args, "command", None) or selected
    return f"{PROG} {name}" if name else PROG


if __name__ == "__main__":
    sys.exit(main())
