"""When `auto` calibrates: a machine kind's calibration is shared by every home, and a short run never waits for one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.settings import EncoderSettings, Settings
from models.encoder import loader
from models.encoder.loader import choose_mode
from models.encoder.spec import EncoderSpec
from nightscore import cli
from tests.tiny_model import tiny_spec


def auto_spec(cache: Path, **fields: object) -> EncoderSpec:
    """Return the tiny model under auto (torch only, one small budget: a calibration of seconds), caching in cache."""
    return tiny_spec(precision="auto", cache_dir=str(cache), calibration_budgets=(256,), device="cpu", **fields)


def test_the_engine_cache_is_one_per_user_whatever_the_home(tmp_path: Path) -> None:
    first, second = Settings(home=tmp_path / "a"), Settings(home=tmp_path / "b")
    assert first.engine_cache == second.engine_cache and tmp_path not in first.engine_cache.parents
    pinned = Settings(home=tmp_path / "a", encoder=EncoderSettings(engine_cache_dir=tmp_path / "engine"))
    assert pinned.engine_cache == tmp_path / "engine"


def test_a_short_run_takes_the_default_mode_and_writes_no_calibration(tmp_path: Path) -> None:
    choice = choose_mode(auto_spec(tmp_path), expected_tokens=2_000)
    assert choice.how == "default" and (choice.mode.backend, choice.mode.precision) == ("torch", "fp32")
    assert "does not pay" in choice.note and not (tmp_path / "calibration").exists()


def test_a_run_that_pays_for_it_calibrates_and_the_next_reads_the_choice(tmp_path: Path) -> None:
    spec = auto_spec(tmp_path, calibrate_when_encode_s=0.0)  # every run pays: calibrate
    choice = choose_mode(spec, expected_tokens=2_000)
    assert choice.how == "calibrated" and list((tmp_path / "calibration").rglob("*.json"))
    later = choose_mode(auto_spec(tmp_path), expected_tokens=10)  # a short run on a calibrated machine kind
    assert later.how == "persisted" and later.mode == choice.mode


def test_calibrate_command_measures_then_reads_and_a_pinned_mode_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = auto_spec(tmp_path / "engine")
    for name, value in {
        "NIGHTSCORE_MODEL": str(spec.model_path),
        "NIGHTSCORE_BACKEND": "torch",
        "NIGHTSCORE_PRECISION": "auto",
        "NIGHTSCORE_DEVICE": "cpu",
        "NIGHTSCORE_CALIBRATION_BUDGETS": json.dumps([256]),
        "NIGHTSCORE_ENGINE_CACHE_DIR": str(tmp_path / "engine"),
    }.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["calibrate", "--home", str(tmp_path / "home")]) == 0
    first = capsys.readouterr().out
    assert "chosen: torch/" in first and "measured in" in first and "torch/fp32@256" in first
    monkeypatch.setattr(loader, "_CACHE", {})  # a new process: what `nightscore calibrate` is on a second call
    assert cli.main(["calibrate", "--home", str(tmp_path / "other-home")]) == 0  # another home, the same machine kind
    assert "read from an earlier calibration" in capsys.readouterr().out
    monkeypatch.setenv("NIGHTSCORE_PRECISION", "fp32")
    assert cli.main(["calibrate", "--home", str(tmp_path / "home")]) == 2
    assert "nothing to calibrate" in capsys.readouterr().err
