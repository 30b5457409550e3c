"""One user's cache entry: candidate item ids in fused order and their stage-two feature rows (msgpack, float32).

The batch run computes every feature the ranker reads at publish time (models/recommender/ranker_features.py), so the
service reads one entry per request and only scores it: training rows and served rows come from the same
function. ``feature_set`` names the feature columns (a digest of their names, `feature_set_id`); the service
refuses to score an entry whose feature set is not its ranker's.

Format: ``[PAYLOAD_VERSION, feature_set, item_ids, n_features, little-endian float32 bytes (rows x n_features)]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack
import numpy as np

PAYLOAD_VERSION = 2
"""Format version stored first in every payload; readers reject any other value."""

_FLOAT = np.dtype("<f4")


@dataclass(frozen=True)
class CandidateEntry:
    """A user's candidates (best first) and their feature rows, in the column order of one feature set."""

    item_ids: list[str]
    features: np.ndarray  # (len(item_ids), n_features) float32
    feature_set: str

    def __post_init__(self) -> None:
        if self.features.ndim != 2 or self.features.shape[0] != len(self.item_ids):
            raise ValueError(
                f"need one feature row per item id: {len(self.item_ids)} ids, features of shape {self.features.shape}"
            )


def feature_set_id(names: Sequence[str]) -> str:
    """Return the short digest that names an ordered set of feature columns."""
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]


def encode_entry(entry: CandidateEntry) -> bytes:
    """Pack an entry into its payload."""
    rows = np.ascontiguousarray(entry.features, dtype=_FLOAT)
    return msgpack.packb(
        [PAYLOAD_VERSION, entry.feature_set, [str(i) for i in entry.item_ids], int(rows.shape[1]), rows.tobytes()],
        use_bin_type=True,
    )


def decode_entry(blob: bytes) -> CandidateEntry:
    """Unpack a payload into its entry (features as a read-only float32 view of the payload's bytes).

    Raises:
        ValueError: the blob is not a payload of version PAYLOAD_VERSION or is malformed.
    """
    try:
        payload = msgpack.unpackb(blob, raw=False, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"candidate payload is not valid msgpack: {exc}") from exc
    if not isinstance(payload, list) or len(payload) != 5 or payload[0] != PAYLOAD_VERSION:
        version = payload[0] if isinstance(payload, list) and payload else None
        raise ValueError(f"unknown candidate payload format (version {version!r}, expected {PAYLOAD_VERSION})")
    _, feature_set, item_ids, n_features, raw = payload
    if (
        not isinstance(item_ids, list)
        or not isinstance(raw, bytes)
        or not isinstance(n_features, int)
        or n_features < 1
        or len(raw) != 4 * n_features * len(item_ids)
    ):
        raise ValueError("candidate payload features do not match its item ids")
    features = np.frombuffer(raw, dtype=_FLOAT).reshape(len(item_ids), n_features)
    return CandidateEntry(item_ids, features, str(feature_set))
