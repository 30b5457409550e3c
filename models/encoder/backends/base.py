"""The backend interface: load a model in one precision, warm it up, run a padded batch to hidden states."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from models.encoder.st_layout import ModelInfo


class BackendUnavailable(Exception):
    """A backend or precision cannot run on this machine; the message says why (tests skip with it)."""


@dataclass(frozen=True)
class BackendRequest:
    """What a backend is asked to load: the model, its fp32 torch module, the precision, device and cache."""

    info: ModelInfo
    module: torch.nn.Module  # the fp32 reference model, in eval mode; a backend casts or converts a copy
    precision: str
    device: torch.device
    threads: int
    cache_dir: Path | None  # converted models live under <cache_dir>/converted/<digest>/<backend>-<precision>/
    # (input_ids, mask) batches of the built-in calibration corpus: activation statistics for int8 smoothing
    sample_batches: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    # batches of another corpus (other seed): where a backend grades its own int8 choices against fp32
    validation_batches: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    int8_floor: float = 0.99
    # over 0 (auto's calibration): int8 that cannot beat float by this tokens/s ratio is refused before any search
    int8_min_speedup: float = 0.0
    # auto's calibration: a float precision whose kernels measure far slower than fp32 here is refused unloaded
    refuse_slow_kernels: bool = False
    streams: int = 1  # batches run at once (a backend that cannot keeps 1)
    compile_mode: str = "none"  # CUDA only: torch.compile mode of a backend that compiles (torch-packed); none: eager


class Backend(Protocol):
    """One loaded model in one precision on one device."""

    name: str
    precision: str
    length_multiple: int  # batch lengths are padded up to a multiple of this (1: no extra padding)
    streams: int  # batches it runs at once; over 1, hidden_states is thread-safe and the engine overlaps batches
    # A backend with `packed = True` also has packed_hidden_states(PackedBatch) -> [tokens, width]: the engine then
    # hands it padding-free batches (models/encoder/tokens.py) instead of padded ones.

    @property
    def version(self) -> str:
        """Return the runtime and precision that produce the vectors, e.g. 'openvino-2026.4.1/bf16'."""
        ...

    def warm_up(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        """Run one batch and discard it (first-call compilation and allocation happen here)."""
        ...

    def hidden_states(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | np.ndarray:
        """Return the last hidden states [rows, length, width] of one padded batch (any float dtype)."""
        ...


class HiddenStates(torch.nn.Module):
    """(input_ids, attention_mask) -> last_hidden_state: the signature a backend converts or exports."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Return the last hidden states."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def converted_dir(request: BackendRequest, backend: str) -> Path | None:
    """Return the cache folder of a converted model keyed by model digest, backend and precision, or None."""
    if request.cache_dir is None:
        return None
    return Path(request.cache_dir) / "converted" / request.info.digest / f"{backend}-{request.precision}"


def write_atomically(path: Path, data: bytes) -> None:
    """Write data to path under a temporary name, then rename it into place (a killed run leaves no half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}.tmp-{time.time_ns()}")
    staging.write_bytes(data)
    staging.replace(path)
