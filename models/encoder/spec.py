"""What to load and how to run it: EncoderSpec (the model, device, backend, precision, floors), Mode (one way to
run it) and Calibration (the mode auto chose, and how).

A spec is built from the encoder's settings (`EncoderSpec.from_settings`); its defaults are those settings'
defaults, written once in core/settings.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from core.settings import EncoderSettings, Settings
from models.encoder.precision import Fidelity

_DEFAULTS = EncoderSettings()


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


@dataclass(frozen=True)
class EncoderSpec:
    """What to load: the model folder, where to run it, which backend and precision, and where conversions are cached."""

    model_path: str | None = _DEFAULTS.model  # a local folder in sentence-transformers layout (default: the packaged MiniLM)
    device: str = _DEFAULTS.device
    precision: str = _DEFAULTS.precision  # auto | fp32 | bf16 | fp16 | int8
    backend: str = _DEFAULTS.backend  # auto | torch | torch-packed | openvino | onnxruntime
    max_seq_length: int = _DEFAULTS.max_seq_length  # a cap: the model's own max_seq_length applies when lower
    num_threads: int | None = _DEFAULTS.num_threads
    cache_dir: str | None = None  # conversions and calibrations; auto calibrates only when one is given
    float_floor: float = _DEFAULTS.fidelity_floor_float
    int8_floor: float = _DEFAULTS.fidelity_floor_int8
    padding_floor: float = _DEFAULTS.padding_floor  # auto: no mode whose calibration pads more (when one pads less)
    token_budget: int | None = _DEFAULTS.token_budget  # None: auto's calibrated budget (or the device default)
    calibration_budgets: tuple[int, ...] | None = None  # None: the device's candidate budgets
    recalibrate: bool = _DEFAULTS.recalibrate  # ignore a persisted calibration and measure again
    calibrate_when_encode_s: float = _DEFAULTS.calibrate_when_encode_s  # a shorter run does not wait for a calibration
    length_multiple: int = 1  # pinned modes: pad batch lengths to a multiple (resolve_mode carries auto's choice)
    streams: int = _DEFAULTS.streams  # pinned modes: batches run at once where the backend can (OpenVINO CPU streams)
    tokenizer_threads: int | None = _DEFAULTS.tokenizer_threads  # None: 1 on CPU, every core up to 16 on CUDA
    compile_mode: str = _DEFAULTS.compile_mode  # CUDA: torch.compile mode of torch-packed (none: eager)

    @classmethod
    def from_settings(cls, settings: Settings) -> EncoderSpec:
        """Return the spec the settings ask for (auto still to be resolved by calibration), caching under engine_cache."""
        options = settings.encoder
        return cls(
            model_path=options.model,
            device=options.device,
            precision=options.precision,
            backend=options.backend,
            max_seq_length=options.max_seq_length,
            num_threads=options.num_threads,
            cache_dir=str(settings.engine_cache),
            float_floor=options.fidelity_floor_float,
            int8_floor=options.fidelity_floor_int8,
            padding_floor=options.padding_floor,
            token_budget=options.token_budget,
            calibration_budgets=tuple(options.calibration_budgets) if options.calibration_budgets else None,
            recalibrate=options.recalibrate,
            calibrate_when_encode_s=options.calibrate_when_encode_s,
            streams=options.streams,
            tokenizer_threads=options.tokenizer_threads,
            compile_mode=options.compile_mode,
        )

    def pinned(self, mode: Mode) -> EncoderSpec:
        """Return the spec with a mode pinned: what every shard worker loads, whatever its own cache folder holds."""
        return replace(
            self,
            backend=mode.backend,
            precision=mode.precision,
            token_budget=mode.token_budget,
            length_multiple=mode.length_multiple,
            streams=mode.streams,
            recalibrate=False,
        )


@dataclass(frozen=True)
class Calibration:
    """The outcome of auto: the chosen mode, its fidelity and speed, where and how it was decided."""

    mode: Mode
    fidelity: Fidelity
    tokens_per_s: float
    device_kind: str
    seconds: float
    from_cache: bool
    table: list[dict[str, object]] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """Return the calibration's fields for run records and artifacts."""
        return {
            "calibration_device_kind": self.device_kind,
            "calibration_tokens_per_s": round(self.tokens_per_s, 1),
            "calibration_seconds": round(self.seconds, 2),
            "calibration_from_cache": self.from_cache,
            "calibration_candidates": self.table,
        }
