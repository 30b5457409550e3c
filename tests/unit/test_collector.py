"""The cyclic collector held off during heavy imports, then kept off what they built (core/collector.py)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.collector import imports_held


@pytest.fixture
def collector() -> Iterator[None]:
    """Leave the worker's collector as the test found it: enabled, nothing frozen by the test."""
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.enable()


def _module(folder: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write a module that builds a recognisable object at import, importable as name."""
    (folder / f"{name}.py").write_text("class Marker:\n    pass\n\nBUILT = [Marker() for _ in range(1000)]\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_new_import_runs_with_the_collector_off_and_what_it_built_is_frozen(
    collector: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, "held_module", monkeypatch)
    with imports_held():
        off_inside = not gc.isenabled()
        import held_module
    assert off_inside and gc.isenabled()
    built = held_module.BUILT
    assert gc.get_freeze_count() >= len(built)
    assert not any(obj is built for obj in gc.get_objects())  # frozen objects are in no generation


def test_without_a_new_import_nothing_is_frozen_and_an_off_collector_stays_off(collector: None) -> None:
    gc.disable()
    with imports_held():
        import json  # already loaded: nothing new to freeze

    assert json.dumps([]) == "[]"
    assert gc.get_freeze_count() == 0 and not gc.isenabled()


def test_a_failing_import_turns_the_collector_back_on(collector: None) -> None:
    with pytest.raises(ModuleNotFoundError), imports_held():
        import no_such_module_here  # noqa: F401
    assert gc.isenabled()
