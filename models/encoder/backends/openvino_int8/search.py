"""OpenVINO int8: static post-training quantisation (NNCF, SmoothQuant) with the lossiest layer roles kept float.

Static int8 (weights per channel, activations with calibrated scales) is what lets the CPU multiply in
int8 (VNNI): on all-MiniLM-L6-v2 about 1.6x OpenVINO bf16, but at min cosine 0.977 to torch fp32 when every
Linear is quantised. Which layers stay float is measured per model, never a list tuned on one: quantise
everything; if the validation texts' min cosine is under the target (the int8 floor plus a margin for
texts not seen here), quantise once more with each *role* (the same Linear in every block, e.g. the FFN
down-projection, or the fused attention whose query and key NNCF quantises) kept float, then keep roles float
in the order of what each recovered until the target is met. Statistics come from one corpus and the verdict
from another, so the choice is not graded on its own calibration data. The trials share one collection of those
statistics (`shared_statistics`).

Under `auto` the search is only worth its minutes where int8 can win: the all-int8 model is the fastest any
choice of float roles can be, so it is timed against the float model first (same hint, same threads, one
planned-size batch) and, when it is not `min_speedup` times faster, the search stops there (Int8NotFaster).
On a 2-core AVX2 EPYC without VNNI all-int8 ran at 0.73-0.97x OpenVINO fp32: the search had cost 175 s for nothing.
Before that, the model's largest MatMul alone is timed the same way (`openvino_int8_probe`, a few seconds): where
it is clearly slower in int8, the statistics the model-level gate needs are not collected at all.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.encoder.backends.base import BackendUnavailable
from models.encoder.backends.int8 import SMOOTHING_ALPHA
from models.encoder.backends.openvino_int8 import probe
from models.encoder.backends.openvino_int8.shared_statistics import SharedStatistics
from models.encoder.backends.timing import best_seconds
from models.encoder.pooling import pool_numpy
from models.encoder.precision import fidelity

log = logging.getLogger(__name__)


MARGIN = 0.004  # validation must reach floor + MARGIN: unseen texts measured up to 0.003 under it on MiniLM
_LAYER_INDEX = re.compile(r"\.\d+(?=\.|/|$)")

# NNCF quantises the inputs of both: a Linear's, and attention's query and key. On an AMX Xeon, with the float
# layers in bf16, int8 attention alone took the random BERT's min cosine from 0.997 to 0.952 and MiniLM's all-int8
# from 0.958 to 0.863, whatever MatMuls stayed float: the search must be able to keep it float too.
QUANTIZED_TYPES = ("MatMul", "ScaledDotProductAttention")
Inputs = dict[str, np.ndarray]  # input_ids and attention_mask of one batch


class QuantizationFailed(BackendUnavailable):
    """No set of float roles reached the floor plus margin (the message names both and the best measured)."""


class Int8NotFaster(BackendUnavailable):
    """All-int8, the fastest int8 there is, did not beat the float model here (the message names both speeds)."""


@dataclass(frozen=True)
class Validation:
    """Batches with torch fp32's pooled vectors for them, and how the model pools."""

    batches: Sequence[Inputs]
    expected: np.ndarray  # [texts, width], one row per batch row, batches concatenated
    pooling: str
    normalize: bool


@dataclass(frozen=True)
class StaticInt8:
    """The quantised model, the operations kept float (and the roles kept wholly float), what it measured."""

    model: Any  # openvino.Model
    float_roles: tuple[str, ...]
    float_ops: tuple[str, ...]
    min_cosine: float
    quantized_ops: int
    ops: int
    seconds: float


@dataclass(frozen=True)
class SpeedGate:
    """How fast all-int8 must run against the float model (real tokens/s ratio) for the search to go on."""

    min_speedup: float
    float_model: Any  # openvino.Model: the float IR int8 is measured against
    rows: int = 32
    length: int = 64
    repeats: int = 5


def quantized_roles(model: Any) -> dict[str, list[str]]:
    """Return the operations NNCF quantises (MatMuls and fused attention) grouped by role: their names with the
    block index taken out."""
    roles: dict[str, list[str]] = {}
    for op in model.get_ordered_ops():
        if op.get_type_name() in QUANTIZED_TYPES:
            name = op.get_friendly_name()
            roles.setdefault(_LAYER_INDEX.sub(".N", name.split("/")[0]), []).append(name)
    return roles


def min_cosine(model: Any, validation: Validation, config: dict[str, object]) -> float:
    """Return the min cosine of model's pooled vectors to the expected ones over the validation batches."""
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", config)
    rows = [
        pool_numpy(compiled(batch)[0], batch["attention_mask"], validation.pooling, validation.normalize)
        for batch in validation.batches
    ]
    return fidelity(validation.expected, np.vstack(rows)).min


def tokens_per_s(models: Sequence[Any], batch: Inputs, config: dict[str, object], repeats: int) -> list[float]:
    """Return each model's best-of-repeats tokens/s on one batch, the models timed in interleaved passes."""
    seconds = best_seconds(probe.latency_calls(models, batch, config), repeats)
    return [batch["input_ids"].size / each for each in seconds]


def timing_batch(validation: Validation, rows: int, length: int) -> Inputs:
    """Return a [rows, length] batch of the validation texts' token ids, run end to end (a planned batch's size)."""
    ids = np.concatenate([batch["input_ids"][0] for batch in validation.batches])
    ids = np.resize(ids, rows * length).reshape(rows, length)
    return {"input_ids": ids.astype(np.int64), "attention_mask": np.ones_like(ids, dtype=np.int64)}


def check_matmul_speed(config: dict[str, object], gate: SpeedGate) -> None:
    """Raise Int8NotFaster when the float model's largest MatMul alone runs clearly under min_speedup in int8."""
    speedup = probe.matmul_speedup(gate.float_model, config, gate.rows * gate.length)
    log.info("int8 MatMul probe: %.2fx float", speedup)
    if speedup < gate.min_speedup * probe.MARGIN:
        raise Int8NotFaster(
            f"the largest MatMul alone ran at {speedup:.2f}x float in int8 (under {gate.min_speedup:g}x "
            f"x {probe.MARGIN:g}): all-int8 cannot gain the {gate.min_speedup:g}x int8 must here; no float roles searched"
        )


def check_speed(quantized: Any, validation: Validation, config: dict[str, object], gate: SpeedGate) -> None:
    """Raise Int8NotFaster when the all-int8 model runs under min_speedup times the float model's tokens/s."""
    batch = timing_batch(validation, gate.rows, gate.length)
    float_speed, int8_speed = tokens_per_s([gate.float_model, quantized], batch, config, gate.repeats)
    log.info("all-int8 %.0f tokens/s, float %.0f tokens/s (%.2fx)", int8_speed, float_speed, int8_speed / float_speed)
    if int8_speed < gate.min_speedup * float_speed:
        raise Int8NotFaster(
            f"all-int8 ran at {int8_speed:.0f} tokens/s against float {float_speed:.0f} "
            f"({int8_speed / float_speed:.2f}x, under the {gate.min_speedup:g}x int8 must gain here): no float roles searched"
        )


def quantize_to_target(
    model: Any,
    calibration: Sequence[Inputs],
    validation: Validation,
    floor: float,
    config: dict[str, object],
    gate: SpeedGate | None = None,
) -> StaticInt8:
    """Return the static int8 model with the fewest float operations found at floor + MARGIN.

    Roles first (greedy by measured recovery), then each float role's blocks moved back to int8 one by one in
    the order of what each alone costs, while the target holds. Raises QuantizationFailed when even every role
    but one kept float stays under it, and Int8NotFaster (before any search) when gate is given and all-int8
    does not beat the float model by its speedup.
    """
    started = time.perf_counter()
    if gate is not None:
        check_matmul_speed(config, gate)
    search = _Search(model, calibration, validation, config, min(floor + MARGIN, 1.0))
    if gate is not None:
        check_speed(search.quantized(frozenset()), validation, config, gate)
    float_names = search.by_role()
    if float_names:
        search.by_block(float_names)
    kept, (quantized, measured) = search.best()
    if measured < search.target:
        raise QuantizationFailed(
            f"static int8 reached min cosine {measured:.6f} to torch fp32 at best on the validation texts, "
            f"under floor {floor} + margin {MARGIN}"
        )
    roles = tuple(role for role, names in search.roles.items() if set(names) <= kept)
    total = sum(len(names) for names in search.roles.values())
    return StaticInt8(quantized, roles, tuple(sorted(kept)), measured, total - len(kept), total, time.perf_counter() - started)


class _Search:
    """Quantisations of one model tried with different operations kept float, each measured on the validation texts."""

    def __init__(
        self, model: Any, calibration: Sequence[Inputs], validation: Validation, config: dict[str, object], target: float
    ) -> None:
        self.validation, self.config, self.target = validation, config, target
        self.roles = quantized_roles(model)
        self.statistics = SharedStatistics(model, calibration, SMOOTHING_ALPHA)
        self.trials: dict[frozenset[str], tuple[Any, float]] = {}

    def quantized(self, kept: frozenset[str]) -> Any:
        """Return the model quantised with the operations in kept float (quantised and measured once per set)."""
        if kept not in self.trials:
            quantized = self.statistics.quantize(sorted(kept))
            self.trials[kept] = (quantized, min_cosine(quantized, self.validation, self.config))
            log.info("int8 with %d operations float: min cosine %.5f", len(kept), self.trials[kept][1])
        return self.trials[kept][0]

    def cosine(self, kept: frozenset[str]) -> float:
        """Return the min cosine with the operations in kept float."""
        self.quantized(kept)
        return self.trials[kept][1]

    def by_role(self) -> frozenset[str]:
        """Return the float operations of the fewest roles that meet the target (empty: all-int8 does)."""
        if self.cosine(frozenset()) >= self.target:
            return frozenset()
        names = {role: frozenset(self.roles[role]) for role in self.roles}
        recovered = sorted(self.roles, key=lambda role: -self.cosine(names[role]))
        kept: frozenset[str] = frozenset()
        for role in recovered[:-1]:
            kept = kept | names[role]
            if self.cosine(kept) >= self.target:
                return kept
        return kept

    def by_block(self, kept: frozenset[str]) -> None:
        """Move float operations back to int8 one at a time, cheapest first, while the target holds."""
        if self.cosine(kept) < self.target:
            return
        alone = sorted(kept, key=lambda name: -self.cosine(kept - {name}))
        for name in alone:
            if self.cosine(kept - {name}) < self.target:
                return
            kept = kept - {name}

    def best(self) -> tuple[frozenset[str], tuple[Any, float]]:
        """Return the trial that meets the target with the fewest float operations (else the closest one)."""
        return max(self.trials.items(), key=lambda item: (item[1][1] >= self.target, -len(item[0]), item[1][1]))
