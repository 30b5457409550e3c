"""Compact msgpack payload of one user's candidates: item ids and float32 scores."""

from __future__ import annotations

from collections.abc import Sequence

import msgpack
import numpy as np

PAYLOAD_VERSION = 1
"""Format version stored first in every payload; readers reject any other value."""

_SCORE_DTYPE = np.dtype("<f4")


def encode_candidates(item_ids: Sequence[str], scores: Sequence[float] | np.ndarray) -> bytes:
    """Pack item ids and their scores into one payload: [version, ids, little-endian float32 bytes].

    Raises:
        ValueError: scores are not one-dimensional or their count differs from the ids'.
    """
    packed = np.ascontiguousarray(scores, dtype=_SCORE_DTYPE)
    if packed.ndim != 1 or packed.shape[0] != len(item_ids):
        raise ValueError(f"need one score per item id: {len(item_ids)} ids, scores of shape {packed.shape}")
    return msgpack.packb([PAYLOAD_VERSION, [str(i) for i in item_ids], packed.tobytes()], use_bin_type=True)


def decode_candidates(blob: bytes) -> tuple[list[str], np.ndarray]:
    """Unpack a payload into (item ids, float32 scores in native byte order).

    Raises:
        ValueError: the blob is not a payload of version PAYLOAD_VERSION or is malformed.
    """
    try:
        payload = msgpack.unpackb(blob, raw=False, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"candidate payload is not valid msgpack: {exc}") from exc
    if not isinstance(payload, list) or len(payload) != 3 or payload[0] != PAYLOAD_VERSION:
        version = payload[0] if isinstance(payload, list) and payload else None
        raise ValueError(f"unknown candidate payload format (version {version!r}, expected {PAYLOAD_VERSION})")
    _, item_ids, raw_scores = payload
    if not isinstance(item_ids, list) or not isinstance(raw_scores, bytes) or len(raw_scores) != 4 * len(item_ids):
        raise ValueError("candidate payload scores do not match its item ids")
    return item_ids, np.frombuffer(raw_scores, dtype=_SCORE_DTYPE).astype(np.float32)
