"""The cascade of topic decisions: which items a larger encoder re-scores under a budget, and what that buys.

Every item is scored by the small model first. An item is uncertain when its top-2 topic margin is small, or when
the small model truncated its text; the budget (a share of the items, or seconds of the large model) decides how
many of the most uncertain ones the large model re-scores. The routing order is fixed (truncated texts first when
they route, then by margin, least sure first), so the margin threshold of a run is the one its budget reaches.

Pure numpy: the encoders and the run's files are the caller's (tasks/route.py, benchmarks/cascade.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REASONS = ("truncated", "margin")  # why an item was routed
CURVE_SHARES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)  # shares routed the run's curve is drawn at


@dataclass(frozen=True)
class Budget:
    """How much of the large model a run may spend: a share of its items and/or seconds (None: no such limit)."""

    share: float | None = None
    seconds: float | None = None

    @property
    def routes(self) -> bool:
        """Return whether anything may be routed (a budget is set and neither limit is 0)."""
        limits = [b for b in (self.share, self.seconds) if b is not None]
        return bool(limits) and min(limits) > 0

    def label(self) -> str:
        """Return the budget as the run records it, e.g. 'share 0.2, 30 s' ('none' without one)."""
        parts = ([f"share {self.share:g}"] if self.share is not None else []) + (
            [f"{self.seconds:g} s"] if self.seconds is not None else []
        )
        return ", ".join(parts) or "none"


def route_order(margin: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """Return item positions in routing order: truncated texts first, then by margin, least sure first (ties: position)."""
    return np.lexsort((np.arange(len(margin)), np.asarray(margin), ~np.asarray(truncated, dtype=bool)))


def items_within(budget: Budget, tokens_in_order: np.ndarray, seconds_per_token: float, spent_s: float = 0.0) -> int:
    """Return how many items, taken in routing order, the budget pays for.

    Args:
        budget: the share of the items and/or the seconds the large model may spend.
        tokens_in_order: each item's token count, in routing order (the seconds budget is spent in tokens).
        seconds_per_token: the large model's measured encode cost per token (the seconds budget's exchange rate).
        spent_s: large-model seconds already spent (the sample the curve is drawn from).
    """
    if not budget.routes:
        return 0
    count = len(tokens_in_order)
    if budget.share is not None:
        count = min(count, int(np.floor(budget.share * len(tokens_in_order) + 1e-9)))
    if budget.seconds is not None:
        cost = np.cumsum(np.asarray(tokens_in_order, dtype=np.float64)) * seconds_per_token
        count = min(count, int(np.searchsorted(cost, budget.seconds - spent_s, side="right")))
    return count


@dataclass(frozen=True)
class Routing:
    """Which items go to the large model and why, and the margin threshold the budget reached."""

    routed: np.ndarray  # bool per item
    truncated: np.ndarray  # bool per item: routed because its text was truncated (else for its margin)
    threshold: float | None  # the largest margin routed for its margin (None: none was)

    @property
    def count(self) -> int:
        """Return how many items are routed."""
        return int(self.routed.sum())

    @property
    def by_reason(self) -> dict[str, int]:
        """Return the routed items per reason (truncated, margin)."""
        return {"truncated": int(self.truncated.sum()), "margin": self.count - int(self.truncated.sum())}


def route(margin: np.ndarray, truncated: np.ndarray, count: int, route_truncated: bool = True) -> Routing:
    """Return the routing of the first ``count`` items in routing order (truncation counts only when it routes)."""
    margin = np.asarray(margin, dtype=np.float64)
    cut = np.asarray(truncated, dtype=bool) & route_truncated
    routed = np.zeros(len(margin), dtype=bool)
    routed[route_order(margin, cut)[: max(count, 0)]] = True
    by_margin = routed & ~cut
    threshold = float(margin[by_margin].max()) if by_margin.any() else None
    return Routing(routed, routed & cut, threshold)


@dataclass(frozen=True)
class CurvePoint:
    """The cascade at one share routed, measured on items both models scored."""

    share_routed: float
    threshold: float | None  # the margin the share reaches
    agreement: float  # share of the items whose cascade topic is the all-large topic
    accuracy: float | None  # share whose cascade topic is their label (None: no labels)
    cost_ratio: float  # (small model on all + large model on the routed) / large model on all, in encode seconds


@dataclass(frozen=True)
class Sample:
    """Items scored by both models: each model's decisions, the small one's margins, tokens and encode seconds."""

    small: np.ndarray  # small model's topic index per item
    large: np.ndarray  # large model's topic index per item
    margin: np.ndarray  # small model's top-2 margin
    truncated: np.ndarray  # small model truncated the text
    tokens: np.ndarray  # tokens per text (the large model's cost is spent in tokens)
    small_s: float  # small model's encode seconds on all of them
    large_s: float  # large model's encode seconds on all of them


def measure(sample: Sample, routed: np.ndarray, threshold: float | None = None, labels: np.ndarray | None = None) -> CurvePoint:
    """Return the cascade on the sample with the ``routed`` items' topics from the large model."""
    topics = np.where(routed, sample.large, sample.small)
    tokens = np.asarray(sample.tokens, dtype=np.float64)
    routed_s = sample.large_s * float(tokens[routed].sum() / max(tokens.sum(), 1.0))
    return CurvePoint(
        share_routed=float(routed.mean()) if len(topics) else 0.0,
        threshold=threshold,
        agreement=float((topics == sample.large).mean()) if len(topics) else 1.0,
        accuracy=None if labels is None or not len(topics) else float((topics == labels).mean()),
        cost_ratio=(sample.small_s + routed_s) / sample.large_s if sample.large_s > 0 else float("nan"),
    )


def curve_point(sample: Sample, share: float, route_truncated: bool = True, labels: np.ndarray | None = None) -> CurvePoint:
    """Return the cascade on the sample with ``share`` of its items routed (in routing order)."""
    routing = route(sample.margin, sample.truncated, round(share * len(sample.small)), route_truncated)
    return measure(sample, routing.routed, routing.threshold, labels)


def cascade_curve(
    sample: Sample, shares: tuple[float, ...] = CURVE_SHARES, route_truncated: bool = True, labels: np.ndarray | None = None
) -> list[CurvePoint]:
    """Return the cascade's agreement (and accuracy, given labels) and cost at each share routed."""
    return [curve_point(sample, share, route_truncated, labels) for share in shares]


def worth_shipping(point: CurvePoint, reference_accuracy: float, keep: float = 0.98, max_cost: float = 0.35) -> bool:
    """Return whether a cascade point keeps ``keep`` of the all-large accuracy at no more than ``max_cost`` of its cost."""
    quality = point.accuracy if point.accuracy is not None else point.agreement
    return quality >= keep * reference_accuracy and point.cost_ratio <= max_cost
