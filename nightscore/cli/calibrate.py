"""`nightscore calibrate`: measure this machine kind for `auto` now, with a progress bar, and print what it found."""

from __future__ import annotations

from pathlib import Path

import typer

from nightscore.cli.app import HomeOption, command_settings


def calibrate(
    again: bool = typer.Option(False, "--again", help="Measure again even when this machine kind is calibrated."),
    home: Path | None = HomeOption,
) -> None:
    """Calibrate `auto` on this machine kind (backend x precision x token budget), kept for every home; print the table."""
    cfg = command_settings(home, "calibrate")
    from models.encoder.loader import calibrate_machine  # imported here for start-up speed: torch loads in seconds
    from models.encoder.spec import EncoderSpec
    from nightscore.output import calibration_table, progress_bar

    with progress_bar():
        calibration, file = calibrate_machine(EncoderSpec.from_settings(cfg), again)
    typer.echo(calibration_table(calibration, file))
