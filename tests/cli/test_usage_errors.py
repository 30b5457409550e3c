"""Every usage error of the command line: exit 2 and one plain line, before anything runs or is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from nightscore import cli

USAGE = [
    (["runz"], "No such command 'runz'"),
    (["runs", "--bogus"], "No such option: --bogus"),
    (["query", "select 1", "--format", "xml"], "'xml' is not one of"),
    (["prune", "--keep-runs", "0"], "--keep-runs"),
    (["demo-data", "--out", "OUT", "--items", "0"], "--items"),
    (["events", "export", "--run-date", "2026-02-30"], "2026-02-30"),
    (["run", "nightly", "--run-date", "2026-13-45"], "2026-13-45"),
    (["run", "nightly", "--demo", "--items", "x.parquet"], "--demo"),
]


@pytest.mark.parametrize(("argv", "says"), USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_a_usage_error_exits_2_with_one_plain_line(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    args = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert cli.main([*args, "--home", str(home)] if argv[0] != "runz" else args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nightscore: error: ") and says in err, err
    assert "unexpected" not in err and "Traceback" not in err
    assert not home.exists()  # nothing created: not even <home>/logs


def test_a_home_that_is_a_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.write_text("not a folder")
    assert cli.main(["runs", "--home", str(home)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_read_only_commands_on_a_missing_home_create_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    assert cli.main(["runs", "--home", str(home)]) == 2
    assert "no warehouse" in capsys.readouterr().err and not home.exists()


def test_no_command_shows_the_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    shown = capsys.readouterr()
    assert "Usage:" in shown.out + shown.err and "run" in shown.out + shown.err
