"""Lazy public entry points: a package names them, they resolve on first use, and a name may not shadow a module."""

from __future__ import annotations

import importlib
import sys

import pytest

from compress.core.lazy import exports, load

PACKAGES = ("compress.distill", "compress.auto", "compress.quantize", "compress.core.model", "compress.core.data",
            "compress.core.formats", "compress.eval", "compress.eval.latency", "compress.teacher", "compress.students")


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_resolves_to_the_object_its_module_defines(name):
    package = importlib.import_module(name)
    assert package.__all__, name
    for public in package.__all__:
        obj = getattr(package, public)
        assert obj.__module__.startswith(name + "."), (public, obj.__module__)


def test_importing_a_package_imports_none_of_its_modules():
    code = ("import sys, compress.core.formats\n"
            "print(sorted(m for m in sys.modules if m.startswith('compress.core.formats.')))")
    import subprocess

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_an_unknown_name_and_a_name_that_shadows_a_module_are_refused():
    getattr_, names = exports("compress.distill", {"distill": "task"})
    assert names == ["distill"] and getattr_("distill") is importlib.import_module("compress.distill.task").distill
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        getattr_("nothing")
    with pytest.raises(ImportError, match="exports losses, which its modules are named too"):
        exports("compress.distill", {"losses": "losses"})


def test_load_reads_a_module_attr_name():
    assert load("compress.core.lazy:load") is load
