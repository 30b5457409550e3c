"""Benchmark: the topic cascade (small model for all, large model for the uncertain) against all-small and all-large.

The demo's items carry their true topic (the labels nothing here is tuned on). They are split in two: on the
tuning half, each budget (a share of items) sets its margin threshold, as a run's budget does; on the held-out half,
that threshold routes items, and the table reports, per budget: the share actually routed, topic accuracy against
the labels, agreement with the all-large topics, and the measured encode seconds (small model on every item + large
model on the routed ones), each also as a ratio to the all-large run. A cascade is worth shipping where it keeps
>= 98% of the all-large accuracy at <= 35% of its encode seconds (the `ships` column).

    .venv/bin/python benchmarks/cascade.py --large /path/to/all-mpnet-base-v2 [--items 2000] [--device cpu]

The large model's folder: --large, else NIGHTSCORE_LARGE_MODEL (scripts/fetch_large_model.py installs all-mpnet-base-v2).
Prints the CPU flags with the table; the same texts, warm encoders, torch fp32 (or the device's default) for both.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from core.settings import DEFAULT_TOPIC_LABELS, Settings
from data_contracts.inputs import item_text_expr
from models.cascade import Budget, items_within, route
from models.encoder.device import cpu_model_and_flags, resolve_device
from models.encoder.engine import encode_texts, warm_up
from models.encoder.files import model_info
from models.encoder.loader import fixed_default, load_encoder
from models.encoder.spec import EncoderSpec
from models.encoder.text_encoder import TextEncoder
from models.topics import topic_decisions
from nightscore.demo import generate_items, topics

log = logging.getLogger("benchmarks.cascade")

SHARES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 1.0)
KEEP, MAX_COST = 0.98, 0.35


@dataclass(frozen=True)
class Encoded:
    """One model's decisions on a set of texts and the seconds encoding them took (warm)."""

    topic: np.ndarray
    margin: np.ndarray
    seconds: float


@dataclass(frozen=True)
class Row:
    """One line of the table: a budget, its tuned threshold and the held-out figures."""

    budget: str
    threshold: float | None
    routed: float
    accuracy: float
    agreement: float
    seconds: float


def cpu_flags() -> str:
    """Return the CPU model and the flags that matter to the engine."""
    model, flags = cpu_model_and_flags()
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    return f"CPU {model}, {os.cpu_count()} logical cores; flags: {' '.join(f for f in wanted if f in flags) or '-'}"


def encoder_for(path: str | None, device: str, max_seq_length: int) -> TextEncoder:
    """Return a warm encoder of a model folder (None: the packaged MiniLM) in the device's default mode, pinned."""
    backend, precision = fixed_default(resolve_device(device))
    spec = EncoderSpec(model_path=path, device=device, backend=backend, precision=precision, max_seq_length=max_seq_length)
    return load_encoder(spec)


def decide(encoder: TextEncoder, texts: list[str], labels: list[str], temperature: float) -> Encoded:
    """Return the encoder's topic decisions on the texts, with the encode seconds (after a warm-up pass)."""
    label_vectors, _ = encode_texts(encoder, labels)
    warm_up(encoder, texts[: min(len(texts), 256)])
    vectors, stats = encode_texts(encoder, texts)
    best, _, margin = topic_decisions(vectors, label_vectors, temperature)
    return Encoded(best, margin, stats.seconds)


def truncated(encoder: TextEncoder, texts: list[str]) -> np.ndarray:
    """Return whether the encoder cuts each text (untruncated token count above its max length)."""
    return np.array([len(e.ids) > encoder.max_length for e in encoder.tokenizer.encode_batch(texts)])


def tuned_threshold(share: float, tune_margin: np.ndarray, tune_cut: np.ndarray) -> float | None:
    """Return the margin threshold a budget of ``share`` reaches on the tuning half (as a run's budget sets it)."""
    return route(tune_margin, tune_cut, items_within(Budget(share=share), np.ones(len(tune_margin)), 0.0)).threshold


def held_out_routing(share: float, threshold: float | None, margin: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """Return which held-out items the tuned threshold routes (truncated texts too, whenever anything routes)."""
    if share >= 1.0:
        return np.ones(len(margin), dtype=bool)
    if share <= 0.0:
        return np.zeros(len(margin), dtype=bool)
    by_margin = margin <= threshold if threshold is not None else np.zeros(len(margin), dtype=bool)
    return by_margin | cut


def large_seconds(encoder: TextEncoder, texts: list[str], routed: np.ndarray) -> float:
    """Return the measured seconds of the large model on the routed texts alone."""
    chosen = [t for t, r in zip(texts, routed, strict=True) if r]
    return encode_texts(encoder, chosen)[1].seconds if chosen else 0.0


def table(args: argparse.Namespace) -> tuple[list[Row], dict[str, float]]:
    """Return the table's rows and the reference figures (all-small, all-large) on the held-out half."""
    items = generate_items(args.items, seed=args.seed).with_columns(item_text_expr())
    names, texts = list(topics()), items.get_column("text").to_list()
    labels = np.array([names.index(t) for t in items.get_column("topic")])
    descriptions = [DEFAULT_TOPIC_LABELS[n] for n in names]
    half = len(texts) // 2  # generate_items draws topics at random: the halves are two samples of one catalogue
    small = encoder_for(None, args.device, Settings().encoder.max_seq_length)
    large = encoder_for(args.large, args.device, Settings().topics.large_max_seq_length)
    temperature = Settings().topics.temperature
    tune, held = decide(small, texts[:half], descriptions, temperature), decide(small, texts[half:], descriptions, temperature)
    big = decide(large, texts[half:], descriptions, temperature)
    cut_tune, cut_held = truncated(small, texts[:half]), truncated(small, texts[half:])
    share_truncated = float(cut_held.mean())
    if not args.route_truncated:  # truncation left to the margin, as NIGHTSCORE_CASCADE_ROUTE_TRUNCATED=false does
        cut_tune, cut_held = np.zeros_like(cut_tune), np.zeros_like(cut_held)
    truth = labels[half:]
    rows = []
    for share in SHARES:
        threshold = tuned_threshold(share, tune.margin, cut_tune)
        routed = held_out_routing(share, threshold, held.margin, cut_held)
        decided = np.where(routed, big.topic, held.topic)
        seconds = held.seconds + (big.seconds if share >= 1.0 else large_seconds(large, texts[half:], routed))
        rows.append(
            Row(f"share {share:g}", threshold, float(routed.mean()), float((decided == truth).mean()),
                float((decided == big.topic).mean()), seconds)
        )  # fmt: skip
    reference = {
        "small_accuracy": float((held.topic == truth).mean()),
        "large_accuracy": float((big.topic == truth).mean()),
        "small_s": held.seconds,
        "large_s": big.seconds,
        "held_out": float(len(truth)),
        "truncated": share_truncated,
    }
    return rows, reference


def render(rows: list[Row], reference: dict[str, float], args: argparse.Namespace) -> str:
    """Return the markdown table with its header lines (CPU flags, models, references)."""
    large_acc, large_s = reference["large_accuracy"], reference["large_s"]
    lines = [
        cpu_flags(),
        f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; demo items seed {args.seed}: "
        f"{int(reference['held_out'])} held out ({100 * reference['truncated']:.1f}% truncated by the small model; "
        f"truncated texts {'routed first' if args.route_truncated else 'routed by their margin only'})",
        f"small {model_info(EncoderSpec()).version}: accuracy {reference['small_accuracy']:.4f}, {reference['small_s']:.2f} s; "
        f"large {model_info(EncoderSpec(model_path=args.large, max_seq_length=512)).version}: accuracy {large_acc:.4f}, "
        f"{large_s:.2f} s (small / large seconds {reference['small_s'] / large_s:.3f})",
        "",
        "| budget | threshold (tuned) | routed (held-out) | accuracy | acc / all-large | agreement with all-large "
        "| encode s | cost / all-large | ships (>=98% acc, <=35% cost) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        keep, cost = r.accuracy / large_acc if large_acc else float("nan"), r.seconds / large_s
        ships = "yes" if keep >= KEEP and cost <= MAX_COST else "no"
        threshold = "-" if r.threshold is None else f"{r.threshold:.4f}"
        lines.append(
            f"| {r.budget} | {threshold} | {100 * r.routed:.1f}% | {r.accuracy:.4f} | {keep:.3f} | {r.agreement:.4f} "
            f"| {r.seconds:.2f} | {cost:.3f} | {ships} |"
        )
    return "\n".join(lines)


def main() -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", default=os.environ.get("NIGHTSCORE_LARGE_MODEL"), help="the large model's folder")
    parser.add_argument("--items", type=int, default=2000, help="demo items (half tune the thresholds, half held out)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the demo items")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--route-truncated",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="truncated texts route first whenever anything routes (--no-route-truncated: by their margin only)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not args.large:
        parser.error("no large model: pass --large or set NIGHTSCORE_LARGE_MODEL (scripts/fetch_large_model.py)")
    started = time.perf_counter()
    rows, reference = table(args)
    print(render(rows, reference, args))
    print(f"\n({time.perf_counter() - started:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
