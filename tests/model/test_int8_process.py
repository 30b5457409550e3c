"""The OpenVINO int8 search in a child process: the same result as in-process, refusals by type, a crash contained."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models.encoder.backends.openvino_int8.process import Int8SearchCrashed, quantize_isolated, read_result, write_job
from models.encoder.backends.openvino_int8.search import MARGIN, Int8NotFaster, Validation, min_cosine
from models.encoder.backends.registry import unavailable_reason
from tests.model.st_models import ARCHS, int8_search_inputs, save_random_model


@pytest.fixture(scope="module")
def search_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[dict[str, np.ndarray]], Validation, dict]:
    """Return (float IR, calibration batches, validation, f32 config on 2 threads) of a random BERT's int8 search."""
    reason = unavailable_reason("openvino", "int8", torch.device("cpu"))
    if reason:
        pytest.skip(f"openvino/int8: {reason}")
    return int8_search_inputs(save_random_model(ARCHS[0], tmp_path_factory.mktemp("int8-process"), seed=5))


def test_the_child_returns_a_model_that_measures_what_it_reports(search_inputs: tuple) -> None:
    float_model, calibration, validation, config = search_inputs
    result = quantize_isolated(float_model, calibration, validation, 0.5, config)
    assert result.float_ops == () and result.quantized_ops == result.ops > 0  # all int8 at a loose floor
    assert min_cosine(result.model, validation, config) == pytest.approx(result.min_cosine, abs=1e-6)


def test_the_childs_refusal_keeps_its_type_and_message(search_inputs: tuple) -> None:
    """Int8NotFaster here; QuantizationFailed crosses the child in tests/model/test_openvino_int8.py, where the loader
    turns it, and only it, into FidelityRefused (the same long refused search twice cost about 14 CPU-s)."""
    float_model, calibration, validation, config = search_inputs
    with pytest.raises(Int8NotFaster, match=r"largest MatMul alone ran at \d+\.\d\dx float in int8"):
        quantize_isolated(float_model, calibration, validation, 1.0 - MARGIN, config, min_speedup=100.0)


def test_a_child_killed_by_a_signal_is_int8_unavailable_naming_the_signal(search_inputs: tuple, tmp_path: Path) -> None:
    float_model, calibration, validation, config = search_inputs
    write_job(tmp_path, float_model, calibration, validation, {"floor": 0.5, "config": config, "min_speedup": 0.0})
    crashed = subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], check=False)
    assert crashed.returncode == -signal.SIGSEGV
    with pytest.raises(Int8SearchCrashed, match="was killed by SIGSEGV and left no result"):
        read_result(tmp_path, crashed.returncode)


def test_a_child_that_fails_outside_the_search_is_int8_unavailable(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text("{}")  # no float IR, no batches: the child raises and exits 1
    with pytest.raises(Int8SearchCrashed, match="exited with status 1 and left no result"):
        quantize_isolated_from(tmp_path)


def quantize_isolated_from(folder: Path) -> None:
    """Run the child on a folder as it stands and read what it left."""
    from models.encoder.backends.openvino_int8.process import _run_child

    read_result(folder, _run_child(folder))


def test_the_child_freezes_torch_openvino_and_nncf_before_the_search(tmp_path: Path) -> None:
    """The child holds the collector off its imports (core/collector.py): the search's full collections walk only
    what it builds, not the 340,000 or so objects the libraries leave."""
    from models.encoder.backends.openvino_int8.process import child_command

    (tmp_path / "job.json").write_text("{}")  # the child loads everything, says what it froze, then fails on the job
    done = subprocess.run(child_command(tmp_path), capture_output=True, text=True, check=False)
    said = re.search(r"int8 search child: (\d+) objects frozen, (\d+) full collections before the search", done.stderr)
    assert done.returncode == 1 and said, done.stderr[-2000:]
    assert int(said.group(1)) >= 200_000 and int(said.group(2)) == 0
