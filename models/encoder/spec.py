"""What to load: the model, where to run it, which backend and precision (EncoderSpec), and one way to run it (Mode)."""

from __future__ import annotations

from dataclasses import dataclass

from models.encoder.precision import DEFAULT_FLOAT_FLOOR, DEFAULT_INT8_FLOOR

DEFAULT_PADDING_FLOOR = 0.97


@dataclass(frozen=True)
class EncoderSpec:
    """What to load: the model, where to run it, which backend and precision, and where conversions are cached.

    The first five fields keep their historical order (callers pass them positionally).
    """

    kind: str = "minilm"  # minilm: the packaged model or model_path's folder; tiny: the random 1-layer twin (tests)
    device: str = "auto"
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 | int8
    max_seq_length: int = 256  # a cap: the model's own max_seq_length applies when lower
    num_threads: int | None = None
    model_path: str | None = None  # a local folder in sentence-transformers layout (default: the packaged MiniLM)
    backend: str = "auto"  # auto | torch | openvino | onnxruntime
    cache_dir: str | None = None  # conversions and calibrations; auto calibrates only when one is given
    float_floor: float = DEFAULT_FLOAT_FLOOR
    int8_floor: float = DEFAULT_INT8_FLOOR
    padding_floor: float = DEFAULT_PADDING_FLOOR  # auto: no mode whose calibration pads more (when one pads less)
    token_budget: int | None = None  # None: auto's calibrated budget (or the device default)
    calibration_budgets: tuple[int, ...] | None = None  # None: the device's candidate budgets
    recalibrate: bool = False  # ignore a persisted calibration and measure again
    length_multiple: int = 1  # pinned modes: pad batch lengths to a multiple (resolve_spec carries auto's choice)
    streams: int = 1  # pinned modes: batches run at once where the backend can (OpenVINO CPU streams)


@dataclass(frozen=True)
class Mode:
    """One way to run the model: backend, precision, token budget per batch, batch-length multiple, streams."""

    backend: str
    precision: str
    token_budget: int
    length_multiple: int = 1
    streams: int = 1  # batches run at once (OpenVINO CPU streams, the threads split between them)

    @property
    def label(self) -> str:
        """Return 'backend/precision@budget' (and '/xN' for lengths padded to a multiple N, '/sN' for N streams)."""
        pad = f"/x{self.length_multiple}" if self.length_multiple > 1 else ""
        streams = f"/s{self.streams}" if self.streams > 1 else ""
        return f"{self.backend}/{self.precision}@{self.token_budget}{pad}{streams}"
