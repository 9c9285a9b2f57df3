"""Paths and writes a hostile user picks: input files that are no files, an --out that is a link, a name the locale
cannot decode, a full disk, a file-size limit, SIGTERM mid-way, two runs into one --out, a recipe stage that fails.

Each is closed at the boundary: compress.core.paths (what a path is, --out followed, the lock of an --out),
compress.core.formats.writes (one staging context that names a failed write), compress.core.signals (SIGTERM
unwinds) and the recipe's manifest. The stage that runs is quantize --backend torch on a tiny model (about a second).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors import SafetensorError

from compress.cli import main
from compress.core.data.sources import DataSource, load_split
from compress.core.data.tasks import get_task
from compress.core.errors import CompressError
from compress.core.formats import writes
from compress.core.paths import check_input_file, output_locks
from compress.core.preflight import check_output
from compress.core.signals import Terminated
from compress.pipeline import run_recipe
from compress.quantize.config import QuantizeConfig
from compress.quantize import run as quantize_run
from compress.quantize.run import quantize
from compress.teacher.corpus import read_documents
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
       "PYTHONDONTWRITEBYTECODE": "1"}
TORCH = QuantizeConfig(backend="torch")
INT8_FILE = "model.int8.safetensors"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    return save_tiny(make_tiny_model(), make_tokenizer(root / "tok"), root / "model")


@pytest.fixture
def place(tmp_path) -> Path:
    """A folder of its own for the outputs, so its listing shows everything a run left."""
    folder = tmp_path / "outs"
    folder.mkdir()
    return folder


def previous_output(place: Path) -> Path:
    """An output a run with --overwrite would replace: it must come through a failed run unchanged."""
    out = place / "q"
    out.mkdir()
    (out / "canary.txt").write_text("previous")
    return out


def unchanged(place: Path, out: Path) -> bool:
    """Only the previous output is in ``place`` (no temporary folder, no lock file), and it is as it was."""
    return sorted(p.name for p in place.iterdir()) == [out.name] and \
        sorted(p.name for p in out.iterdir()) == ["canary.txt"] and (out / "canary.txt").read_text() == "previous"


def one_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------------------- input files named as what they are


def odd_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Paths that are no readable data file, each with what the message must call it."""
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty.csv").write_bytes(b"")
    (tmp_path / "dangling.csv").symlink_to(tmp_path / "gone.csv")
    (tmp_path / "loop.csv").symlink_to(tmp_path / "loop.csv")
    return {
        "fifo": (fifo, "is a FIFO (named pipe); pass a regular file (a pipe can be read only once: save its contents "
                       "to a file first)"),
        "device": (Path(os.devnull), "is a device; pass a regular file"),
        "empty": (tmp_path / "empty.csv", "is empty; pass a file that holds data"),
        "missing": (tmp_path / "gone.csv", "does not exist; check the path"),
        "dangling": (tmp_path / "dangling.csv", f"is a dangling symbolic link (to {tmp_path / 'gone.csv'}, which does "
                                                "not exist); fix the link or pass the file itself"),
        "loop": (tmp_path / "loop.csv", "is a symbolic link loop; fix the link or pass the file itself"),
        "folder": (tmp_path / "folder", "is a directory, but not a folder datasets' save_to_disk wrote; pass a file or "
                                        "a folder datasets' save_to_disk wrote"),
    }


def test_a_data_file_that_is_no_file_is_named_as_what_it_is_by_the_command_and_the_reader(tiny, tmp_path, capsys):
    for kind, (path, said) in odd_paths(tmp_path).items():
        # The command line: refused before the stage is imported (a folder is the reader's to judge: it may be data).
        code = main(["eval", "--model", str(tiny), "--task", "sst2", "--data-file", str(path)])
        assert (code, one_line(capsys)) == (2, f"compress eval: error: data file {path} {said}"), kind
        # The library's reader says the same, and never blocks on the pipe's open.
        with pytest.raises(CompressError) as caught:
            load_split(get_task("sst2"), "dev", DataSource(data_file=str(path)))
        assert str(caught.value) == f"data file {path} {said}", kind


def test_a_corpus_file_that_is_no_file_is_named_as_what_it_is(tmp_path):
    paths = odd_paths(tmp_path)
    for kind in ("fifo", "device", "empty", "dangling", "loop"):
        path, said = paths[kind]
        with pytest.raises(CompressError) as caught:
            read_documents([path])
        assert str(caught.value) == f"corpus file {path} {said}", kind
    with pytest.raises(CompressError, match=r"notes\.txt cannot be reached: .*/sub is a symbolic link loop"):
        (tmp_path / "sub").symlink_to(tmp_path / "sub")
        check_input_file(tmp_path / "sub" / "notes.txt", "corpus file")
    (tmp_path / "text.txt").write_text("One sentence here.\n")
    assert check_input_file(tmp_path / "text.txt") == tmp_path / "text.txt"  # a plain file passes


def test_a_text_file_that_is_no_file_is_named_by_heads_and_latency(tiny, tmp_path):
    """heads --text said "does not exist" of a FIFO and read /dev/null as no lines; latency --lengths did the same."""
    from eval.config import HeadsConfig
    from eval.latency.lengths import real_inputs

    paths = odd_paths(tmp_path)
    for kind in ("fifo", "device", "empty", "missing", "dangling", "loop"):
        path, said = paths[kind]
        with pytest.raises(CompressError) as caught:
            HeadsConfig(text=str(path)).validate()
        assert str(caught.value) == f"--text {path} {said}", kind
        if kind != "missing":  # a missing file may have been meant as a task name: latency says so (tests/eval)
            with pytest.raises(CompressError) as caught:
                real_inputs(str(path), tokenizer=None)
            assert str(caught.value) == f"--lengths file {path} {said}", kind
    folder, _ = paths["folder"]
    with pytest.raises(CompressError, match=rf"^--text {folder} is a directory; pass a file$"):
        HeadsConfig(text=str(folder)).validate()


# ---------------------------------------------------------------------------- --out as a link


def test_an_out_linked_to_a_folder_is_written_into_that_folder(tiny, place):
    target = place / "target"
    target.mkdir()
    link = place / "link"
    link.symlink_to(target, target_is_directory=True)
    assert quantize(tiny, link, TORCH) == target
    assert link.is_symlink() and os.readlink(link) == str(target)  # the link itself is left as it was
    assert (target / INT8_FILE).is_file() and (target / "compression.json").is_file()
    assert sorted(p.name for p in place.iterdir()) == ["link", "target"]  # no .link.old-*, no new ./link folder
    # The target now holds a model: the usual rules apply to it, through the link.
    with pytest.raises(CompressError, match=f"output directory {target} is not empty; pass --overwrite"):
        quantize(tiny, link, TORCH)
    before = (target / INT8_FILE).stat().st_mtime_ns
    assert quantize(tiny, link, TORCH, overwrite=True) == target
    assert (target / INT8_FILE).stat().st_mtime_ns != before and link.is_symlink()
    assert sorted(p.name for p in place.iterdir()) == ["link", "target"]


@pytest.mark.parametrize("kind", ["dangling", "loop", "dangling folder"])
def test_a_broken_out_link_is_refused_before_any_work(tiny, place, capsys, kind):
    link = place / "link"
    if kind == "loop":
        link.symlink_to(link)
        out, said = link, f"--out {link} is a symbolic link loop"
    else:
        link.symlink_to(place / "nowhere")
        out = link / "q" if kind == "dangling folder" else link
        said = (f"--out {out}{'' if out == link else f''''s folder {link}'''} is a dangling symbolic link "
                f"(to {place / 'nowhere'}, which does not exist)")
    code = main(["quantize", "--model", str(tiny), "--backend", "torch", "--out", str(out)])
    assert (code, one_line(capsys)) == (2, f"compress quantize: error: {said}; fix or remove the link, or choose "
                                           "another --out")
    assert sorted(p.name for p in place.iterdir()) == ["link"] and not (place / "nowhere").exists()


# ---------------------------------------------------------------------------- a name the locale cannot decode


def test_a_utf8_out_read_under_the_c_locale_is_written_and_named_in_utf8(tiny, place):
    # Under LC_ALL=C (PYTHONUTF8=0) Python holds the UTF-8 bytes of "été" as the surrogates below.
    name = "été".encode().decode("ascii", "surrogateescape")
    assert quantize(tiny, place / name, TORCH) == place / name
    out = place / "été"
    assert (out / INT8_FILE).is_file()
    assert "été" in (out / "README.md").read_text(encoding="utf-8")  # the card names its folder as the disk does
    writes.write_json_atomic(out / "named.json", {"out": str(place / name), "text": "\\udcc3 stays text"})
    assert json.loads((out / "named.json").read_text(encoding="utf-8")) == {"out": str(out), "text": "\\udcc3 stays text"}


def test_an_out_whose_name_is_not_utf8_is_refused_before_any_work(tiny, place):
    name = b"caf\xe9".decode("ascii", "surrogateescape")  # a Latin-1 name
    with pytest.raises(CompressError) as caught:
        check_output(place / name)
    assert str(caught.value) == f"--out {place}/caf\\udce9: the name is not valid UTF-8 (byte 0xe9); choose a name in UTF-8"
    assert list(place.iterdir()) == []


# ---------------------------------------------------------------------------- a write that fails


def test_a_full_disk_is_one_line_naming_the_file_and_the_previous_output_stays(tiny, place, monkeypatch, capsys):
    out = previous_output(place)

    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)  # what got written before the disk filled up
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr("compress.core.formats.torch_int8.save_file", full_disk)
    code = main(["quantize", "--model", str(tiny), "--backend", "torch", "--out", str(out), "--overwrite"])
    assert (code, one_line(capsys)) == (2, f"compress quantize: error: cannot write {out / INT8_FILE}: no space left "
                                           f"on the device; free space there (df -h {place}) or write to another disk")
    assert unchanged(place, out)


def raise_in_the_save(error: BaseException):
    """A safetensors save that writes a little, then fails with ``error`` (an OSError naming the file it was writing)."""
    def save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)
        if isinstance(error, OSError):
            raise OSError(error.errno, error.strerror, filename)
        raise error
    return save


@pytest.mark.parametrize("error, free, cause, advice", [
    # safetensors keeps the errno in its text only, and names no file: the file being written is found in the stage
    (SafetensorError("Error while serializing: I/O error: File too large (os error 27)"), None,
     "file too large for this process's file-size limit", "raise the limit (ulimit -f unlimited) and run again"),
    # torch.save's writer says neither the cause nor the file: a disk nearly full is the cause then
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"), 4096,
     "no space left on the device", "free space there (df -h {place}) or write to another disk"),
    (OSError(errno.EROFS, "Read-only file system"), None, "read-only file system", "write to a writable file system"),
])
def test_a_write_that_fails_in_any_library_is_named_and_leaves_nothing(tiny, place, monkeypatch, error, free, cause,
                                                                      advice):
    out = previous_output(place)
    monkeypatch.setattr("compress.core.formats.torch_int8.save_file", raise_in_the_save(error))
    if free is not None:
        usage = SimpleNamespace(total=10**9, used=10**9 - free, free=free)
        monkeypatch.setattr(writes.shutil, "disk_usage", lambda path: usage)
    monkeypatch.setattr(writes, "_size_limit", lambda: None)  # the limit of the process running the tests: none
    with pytest.raises(CompressError) as caught:
        quantize(tiny, out, TORCH, overwrite=True)
    assert str(caught.value) == f"cannot write {out / INT8_FILE}: {cause}; {advice.format(place=place)}"
    assert unchanged(place, out)


def test_only_failed_writes_are_said_as_writes(tmp_path):
    target, staging = tmp_path / "out", tmp_path / ".out.tmp-1"
    # A permission error on a file being written is a write's; on a file that is only read, it stays the reader's.
    denied = OSError(errno.EACCES, "Permission denied", str(staging / "vocab.txt"))
    assert str(writes.write_error(denied, target, staging)) == (
        f"cannot write {target / 'vocab.txt'}: permission denied; fix the permissions of {tmp_path} or write somewhere else")
    assert writes.write_error(OSError(errno.EACCES, "Permission denied", "/etc/shadow"), target, staging) is None
    assert writes.write_error(ValueError("not a write"), target, staging) is None
    assert writes.write_error(SafetensorError("Error while deserializing header"), target, staging) is None
    reading = RuntimeError("[enforce fail at inline_container.cc:245] . PytorchStreamReader failed reading zip archive")
    assert writes.write_error(reading, target, staging) is None  # a corrupt checkpoint read: no write of ours
    # A file-size limit, said with its value when the process has one.
    with writes_limit(4096):
        said = str(writes.write_error(OSError(errno.EFBIG, "File too large"), target / "a.bin"))
    assert said == (f"cannot write {target / 'a.bin'}: file too large for this process's file-size limit (4096 bytes, "
                    "ulimit -f); raise the limit (ulimit -f unlimited) and run again")
    # The atomic writer names its own file, and leaves no temporary one.
    with pytest.raises(CompressError, match=f"cannot write {tmp_path / 'r.json'}: no space left on the device"):
        with writes.atomic_path(tmp_path / "r.json") as tmp:
            tmp.write_text("{")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == []


@contextlib.contextmanager
def writes_limit(limit: int):
    before = writes._size_limit
    writes._size_limit = lambda: limit
    try:
        yield
    finally:
        writes._size_limit = before


# A staged output written under a file-size limit, by Python's own files and by safetensors (which removes what it
# failed to write): each failure printed as the one line the command would print.
LIMITED_WRITES = """
import sys
from pathlib import Path
import numpy as np
from safetensors.numpy import save_file
from compress.core.errors import CompressError
from compress.core.formats.writes import staged_dir

out = Path(sys.argv[1])
for how in ("python", "safetensors"):
    try:
        with staged_dir(out, overwrite=True) as tmp:
            (tmp / "config.json").write_text("{}")
            if how == "python":
                (tmp / "weights.bin").write_bytes(bytes(50000))
            else:
                save_file({"w": np.zeros(20000, np.float32)}, str(tmp / "model.safetensors"))
    except CompressError as err:
        print(err)
"""


def test_a_file_size_limit_is_one_line_and_the_previous_output_stays(place):
    out = previous_output(place)

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer instead of failing the write
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))

    proc = subprocess.run([sys.executable, "-c", LIMITED_WRITES, str(out)], env=ENV, cwd=place, preexec_fn=limited,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    limit = "file too large for this process's file-size limit (20000 bytes, ulimit -f); raise the limit (ulimit -f " \
            "unlimited) and run again"
    assert proc.stdout.splitlines() == [f"cannot write {out / 'weights.bin'}: {limit}",
                                        f"cannot write the safetensors weights in {out}: {limit}"]
    assert unchanged(place, out)


# ---------------------------------------------------------------------------- SIGTERM and a second run into one --out


# `compress` with the int8 model's loading made slow: the run is then mid-way, its temporary folder written, for sure.
SLOW_CLI = """
import sys, time
from pathlib import Path
import compress.core.formats.runtime as runtime

def slow(path, **kw):
    Path(sys.argv[1]).write_text("mid-way")
    time.sleep(600)

runtime.load_model = slow
from compress.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.e2e  # a real `compress quantize` process
def test_sigterm_mid_way_leaves_nothing_and_a_second_run_is_refused_naming_the_first(tiny, place, tmp_path, capsys):
    out = previous_output(place)
    marker = tmp_path / "mid-way"
    argv = ["quantize", "--model", str(tiny), "--backend", "torch", "--out", str(out), "--overwrite"]
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, str(marker), *argv], env=ENV, cwd=place,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), proc.stderr.read() if proc.poll() is not None else "never got mid-way"
        assert [p.name for p in place.glob(".q.tmp-*")] and (place / ".q.lock").read_text() == f"{proc.pid}\n"
        # A second run into the same --out: refused at its start, naming the first.
        assert main(argv) == 2
        assert one_line(capsys) == (f"compress quantize: error: --out {out} is being written by another run "
                                    f"(pid {proc.pid}); wait for it to finish or choose another --out")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "compress quantize: terminated", err[-2000:]
    assert unchanged(place, out)  # no .q.tmp-*, no .q.lock, the previous output whole


@contextlib.contextmanager
def held_by_another_process(out: Path):
    """Another process holding the lock of ``out`` (as a run does) until the block ends; its pid."""
    script = "import sys\nfrom compress.core.paths import output_lock\nwith output_lock(sys.argv[1]):\n" \
             "    print('held', flush=True)\n    sys.stdin.read()\n"
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], env=ENV, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_a_lock_is_refused_while_held_and_free_once_its_holder_ends_or_dies(place):
    out = place / "q"
    with held_by_another_process(out) as holder, output_locks():
        with pytest.raises(CompressError) as caught:
            check_output(out)
        assert str(caught.value) == (f"--out {out} is being written by another run (pid {holder.pid}); wait for it "
                                     "to finish or choose another --out")
    assert list(place.iterdir()) == []  # the holder removed its lock file
    with held_by_another_process(out) as holder:
        holder.kill()  # killed: the kernel lets go of the lock, its file stays behind
        holder.wait()
    assert (place / ".q.lock").exists()
    with output_locks():
        assert check_output(out) == out and (place / ".q.lock").read_text() == f"{os.getpid()}\n"
    assert list(place.iterdir()) == []  # released at the end of the run, its file with it
    assert check_output(out) == out and list(place.iterdir()) == []  # outside a run (a library call): no lock


# ---------------------------------------------------------------------------- recipes


def test_a_failed_recipe_stage_says_failed_and_why_and_runs_again(tiny, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    recipe = {"name": "r", "report": False, "stages": [{"name": "int8", "run": "quantize", "model": str(tiny),
                                                        "config": {"backend": "torch"}}]}

    original = quantize_run.require_model_dir

    def stop(error):
        def fail(*args, **kwargs):
            raise error
        monkeypatch.setattr(quantize_run, "require_model_dir", fail)

    def entry() -> dict:
        return json.loads((run_dir / "manifest.json").read_text())["stages"]["int8"]

    for error, reason in [(CompressError("the model is broken; fix it"), "the model is broken; fix it"),
                          (Terminated(), "terminated (SIGTERM)"), (MemoryError(), "MemoryError")]:
        stop(error)
        with pytest.raises(type(error)):
            run_recipe(recipe, run_dir, say=lambda line: None)
        assert (entry()["status"], entry()["reason"]) == ("failed", reason)
    monkeypatch.setattr(quantize_run, "require_model_dir", original)
    said: list[str] = []
    run_recipe(recipe, run_dir, say=said.append)
    assert said == ["[int8] running quantize"] and entry()["status"] == "done" and "reason" not in entry()
    assert (run_dir / "int8" / INT8_FILE).is_file()


def test_a_second_recipe_into_a_run_directory_in_use_is_refused(tiny, tmp_path):
    run_dir = tmp_path / "run"
    recipe = {"stages": [{"name": "int8", "run": "quantize", "model": str(tiny), "config": {"backend": "torch"}}]}
    with held_by_another_process(run_dir) as holder:
        with pytest.raises(CompressError) as caught:
            run_recipe(recipe, run_dir, say=lambda line: None)
    assert str(caught.value) == (f"--out {run_dir} is being written by another run (pid {holder.pid}); wait for it to "
                                 "finish or choose another --out")
    assert not run_dir.exists()
