"""The torch-packed backend: the torch backend's model, run padding-free on token-major batches (models/encoder/packed.py).

Same precisions and weights as the torch backend; BERT encoders only. `auto` times it beside the padded torch
backend and keeps it only where it measures faster.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from models.encoder.backends.base import BackendRequest, BackendUnavailable
from models.encoder.backends.torch_backend import DTYPES, prepared_module
from models.encoder.backends.torch_backend import unavailable_reason as torch_reason
from models.encoder.packed import PackedBert, choose_attention, unsupported
from models.encoder.tokens import PackedBatch, TokenizedTexts, pack_rows

log = logging.getLogger(__name__)


def unavailable_reason(precision: str, device: torch.device) -> str | None:
    """Return why torch-packed cannot run precision on device (None: it can); the model's kind is checked at load."""
    return torch_reason(precision, device)


class TorchPackedBackend:
    """A BERT model run by torch eagerly on packed [tokens, width] batches, in one precision."""

    name = "torch-packed"
    shape_sensitive = False
    packed = True

    def __init__(self, request: BackendRequest) -> None:
        reason = unsupported(request.module)
        if reason:
            raise BackendUnavailable(reason)
        self.precision = request.precision
        self.device = request.device
        self.length_multiple = 1
        self.streams = 1
        self.model = prepared_module(request)
        dtype = DTYPES.get(request.precision, torch.float32)
        self.attention = choose_attention(self.model, self.device, dtype)
        self.runner = PackedBert(self.model, attention=self.attention)
        if request.compile_mode != "none":
            if self.device.type == "cuda":
                self.runner.compile(request.compile_mode)
            else:
                log.info("torch-packed: compile mode %s is for CUDA; eager on %s", request.compile_mode, self.device)

    @property
    def version(self) -> str:
        """Return torch's version, the packed attention and the precision."""
        return f"torch-{torch.__version__.split('+')[0]}-packed-{self.attention}/{self.precision}"

    def warm_up(self, input_ids: np.ndarray, mask: np.ndarray) -> None:
        """Run one batch and discard it."""
        self.hidden_states(input_ids, mask)

    def packed_hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """Return the last hidden states [tokens, width] of one packed batch (moved to the device if it is not there)."""
        batch = batch.to(self.device)
        with torch.inference_mode():
            return self.runner(batch.ids, batch.positions, batch.segments, batch.offsets, batch.longest)

    def hidden_states(self, input_ids: np.ndarray | torch.Tensor, mask: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Return the last hidden states [rows, length, width] of one padded batch, computed packed (padding zero)."""
        ids, attention = torch.as_tensor(input_ids).cpu(), torch.as_tensor(mask).cpu().bool()
        rows = [ids[r, attention[r]].tolist() for r in range(ids.shape[0])]
        hidden = self.packed_hidden_states(pack_rows(TokenizedTexts.from_lists(rows), np.arange(len(rows))))
        out = hidden.new_zeros(ids.shape[0], ids.shape[1], hidden.shape[1])
        out[attention.to(self.device)] = hidden  # right-padded rows: row by row, position by position, as packed
        return out
