"""OpenVINO's usage telemetry stays off: converting a model sends nothing and writes no client id under the home."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openvino")

CONVERT = """
from types import SimpleNamespace

import torch
from models.encoder.backends.openvino_backend import convert
from openvino_telemetry import Telemetry


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(30, 8)

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(last_hidden_state=self.embedding(input_ids) * attention_mask.unsqueeze(-1))


with torch.no_grad():
    convert(Tiny().eval())
print("consent", Telemetry().consent)
"""


def test_a_conversion_in_a_fresh_home_sends_no_telemetry(tmp_path: Path) -> None:
    """Without the decline, openvino_telemetry finds no consent file, takes that as consent, writes a client id
    under ~/intel and sends an event per converted operation from a forked process."""
    env = {**os.environ, "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", CONVERT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "consent False" in done.stdout
    assert not (tmp_path / "intel").exists()  # no client id, no usage counter
