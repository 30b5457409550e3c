"""Stage-two scorers with a numpy-only predict path, and their persistence as bytes (model + metadata json).

Two kinds, one interface (``predict(features) -> float32 scores, higher first``):
    lightgbm   a LambdaRank booster; predict is Booster.predict on the float32 matrix
    mlp        models.ranker.RankerNet's weights as numpy arrays; predict is its forward pass in numpy
               (standardise, two ReLU layers, one logit), equal to the torch module's output to float error
Persistence keeps models/ranker.py's idea for both kinds: the version is a content hash (kind, feature
names, model bytes), stored in the metadata next to the metrics; loading recomputes it and refuses a
mismatch. scorer_to_bytes / scorer_from_bytes write and read bytes, so the caller puts them anywhere (lake).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from core.errors import ModelLoadError

SCORER_FORMAT = 1
MLP_ARRAYS: tuple[str, ...] = ("mean", "std", "w1", "b1", "w2", "b2", "w3", "b3")


class Scorer(Protocol):
    """A trained stage-two model."""

    kind: str
    feature_names: tuple[str, ...]
    metrics: dict[str, float]

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Return one float32 score per row of a (rows, features) matrix."""
        ...

    def model_bytes(self) -> bytes:
        """Return the model's bytes (what the version hashes)."""
        ...


def _check(features: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    x = np.ascontiguousarray(features, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != len(names):
        raise ValueError(f"need a (rows, {len(names)}) feature matrix, got shape {x.shape}")
    return x


@dataclass
class MlpScorer:
    """The MLP as numpy arrays: standardisation, two hidden ReLU layers, one logit."""

    arrays: dict[str, np.ndarray]
    feature_names: tuple[str, ...]
    metrics: dict[str, float] = field(default_factory=dict)
    kind: str = "mlp"

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Return the logits of a (rows, features) matrix (numpy forward pass)."""
        a = self.arrays
        x = (_check(features, self.feature_names) - a["mean"]) / a["std"]
        h = np.maximum(x @ a["w1"].T + a["b1"], 0.0)
        h = np.maximum(h @ a["w2"].T + a["b2"], 0.0)
        return (h @ a["w3"].T + a["b3"])[:, 0].astype(np.float32)

    def model_bytes(self) -> bytes:
        """Return the arrays' float32 bytes in MLP_ARRAYS order (shapes are in the metadata)."""
        return b"".join(np.ascontiguousarray(self.arrays[n], dtype="<f4").tobytes() for n in MLP_ARRAYS)


@dataclass
class LgbmScorer:
    """A LightGBM booster (LambdaRank) and the model text it was built from (what the version hashes)."""

    booster: object
    text: str
    feature_names: tuple[str, ...]
    metrics: dict[str, float] = field(default_factory=dict)
    kind: str = "lightgbm"

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Return the booster's raw scores of a (rows, features) matrix."""
        x = _check(features, self.feature_names)
        return np.asarray(self.booster.predict(x, num_threads=1), dtype=np.float32)  # type: ignore[attr-defined]

    def model_bytes(self) -> bytes:
        """Return the booster's text model as UTF-8."""
        return self.text.encode()


def lgbm_from_booster(booster: object, feature_names: tuple[str, ...]) -> LgbmScorer:
    """Return the scorer of a trained booster (its model text kept as the bytes to hash and store)."""
    return LgbmScorer(booster, str(booster.model_to_string()), tuple(feature_names))  # type: ignore[attr-defined]


def mlp_from_net(net: object, feature_names: tuple[str, ...]) -> MlpScorer:
    """Return the numpy scorer of a trained models.ranker.RankerNet."""
    state = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in net.state_dict().items()}  # type: ignore[attr-defined]
    arrays = {
        "mean": state["mean"],
        "std": state["std"],
        "w1": state["mlp.0.weight"],
        "b1": state["mlp.0.bias"],
        "w2": state["mlp.2.weight"],
        "b2": state["mlp.2.bias"],
        "w3": state["mlp.4.weight"],
        "b3": state["mlp.4.bias"],
    }
    return MlpScorer(arrays, tuple(feature_names))


def scorer_version(scorer: Scorer) -> str:
    """Return the content hash of a scorer: its kind, feature names and model bytes."""
    digest = hashlib.sha256(json.dumps([scorer.kind, list(scorer.feature_names)]).encode())
    digest.update(scorer.model_bytes())
    return f"{scorer.kind}-{digest.hexdigest()[:16]}"


def scorer_to_bytes(scorer: Scorer, extra: Mapping[str, object] | None = None) -> tuple[bytes, bytes]:
    """Return (model bytes, metadata json bytes: format, kind, version, feature names, shapes, metrics, extra)."""
    meta: dict[str, object] = {
        "format": SCORER_FORMAT,
        "kind": scorer.kind,
        "version": scorer_version(scorer),
        "feature_names": list(scorer.feature_names),
        "metrics": scorer.metrics,
        **(extra or {}),
    }
    if isinstance(scorer, MlpScorer):
        meta["shapes"] = {n: list(scorer.arrays[n].shape) for n in MLP_ARRAYS}
    return scorer.model_bytes(), json.dumps(meta, indent=2, sort_keys=True).encode()


def _mlp_arrays(model: bytes, shapes: Mapping[str, list[int]]) -> dict[str, np.ndarray]:
    flat, arrays, offset = np.frombuffer(model, dtype="<f4"), {}, 0
    for name in MLP_ARRAYS:
        size = int(np.prod(shapes[name]))
        arrays[name] = flat[offset : offset + size].reshape(shapes[name]).astype(np.float32)
        offset += size
    if offset != len(flat):
        raise ValueError(f"MLP bytes hold {len(flat)} floats, the shapes {offset}")
    return arrays


def scorer_from_bytes(model: bytes, metadata: bytes) -> Scorer:
    """Return the scorer written by scorer_to_bytes, checked against its recorded version.

    Raises:
        ModelLoadError: corrupt bytes, another format or kind, or a content hash that differs.
    """
    import lightgbm

    try:
        meta = json.loads(metadata)
        names = tuple(meta["feature_names"])
        if meta.get("format") != SCORER_FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {SCORER_FORMAT}")
        scorer: Scorer
        if meta["kind"] == "mlp":
            scorer = MlpScorer(_mlp_arrays(model, meta["shapes"]), names, dict(meta.get("metrics", {})))
        elif meta["kind"] == "lightgbm":
            text = model.decode()
            scorer = LgbmScorer(lightgbm.Booster(model_str=text), text, names, dict(meta.get("metrics", {})))
        else:
            raise ValueError(f"unknown scorer kind {meta['kind']!r}")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, lightgbm.basic.LightGBMError) as exc:
        raise ModelLoadError(f"cannot load scorer: {exc}") from exc
    if scorer_version(scorer) != meta.get("version"):
        raise ModelLoadError(f"scorer content hash {scorer_version(scorer)} differs from its metadata {meta.get('version')}")
    return scorer
