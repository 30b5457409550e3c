"""Encode stage on Ray vs local: the engine per shard here, Prefect-mapped shards on Ray, Ray Data map_batches.

Ray Data runs twice: fed one of our length-planned token-budget batches per call, and one whole shard
per call (the actor batches it with the engine), to separate Ray Data's per-block cost from the model's.

Same texts, same shards (the flow's length buckets), same token-budget batches in every mode. Each mode
runs twice in one Ray session: the first pass ("cold") pays worker/actor start and the model load,
the second ("warm") shows what is left. Ray's own start and the Prefect server's are timed apart.
Prints one table. Usage:

    python benchmarks/ray_encode.py [--model-dir DIR] [--n 2000] [--shard-size 256] [--ray-cpus 2]

Prefect-on-Ray runs a minimal flow with nightscore's task runner (tasks/runner.py) against a Prefect
server this script starts on loopback; Ray Data runs one actor per CPU slot holding the encoder.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.encoder.batching import assign_shards, plan_batches
from models.encoder.engine import encode_texts
from models.encoder.files import load_tokenizer
from models.encoder.loader import get_encoder
from models.encoder.spec import EncoderSpec

log = logging.getLogger("bench")
BUCKETS = [32, 64, 128, 256]


@dataclass
class Work:
    """The texts, their shards (row indices) and what every mode encodes them with."""

    texts: list[str]
    shards: list[np.ndarray]
    spec: EncoderSpec  # the local run's; Ray modes swap in --task-threads threads
    budget: int


@dataclass
class Timing:
    """One mode: cold and warm wall seconds, and the warm pass's vectors."""

    cold: float
    warm: float
    vectors: np.ndarray


def load_texts(n: int) -> list[str]:
    """Return n demo item texts (title + "\\n" + body)."""
    from data_contracts.inputs import item_text_expr
    from nightscore.demo import generate_items

    return generate_items(n, seed=0).select(item_text_expr()).get_column("text").to_list()[:n]


def make_work(args: argparse.Namespace) -> Work:
    """Return the texts cut into the flow's length-bucketed shards."""
    texts = load_texts(args.n)
    tokenizer = load_tokenizer(args.model_dir)
    lengths = np.array([min(len(e.ids), 256) for e in tokenizer.encode_batch(texts)])
    _, shard_of = assign_shards(lengths, BUCKETS, args.shard_size)
    shards = [np.flatnonzero(shard_of == s) for s in np.unique(shard_of)]
    return Work(texts, shards, EncoderSpec(args.model_dir, "cpu", "fp32", "torch", 256, args.threads), 2048)


def timed_twice(run: Callable[[], np.ndarray]) -> Timing:
    """Return the cold and warm wall times of run() and the warm pass's vectors."""
    started = time.perf_counter()
    run()
    cold = time.perf_counter() - started
    started = time.perf_counter()
    vectors = run()
    return Timing(cold, time.perf_counter() - started, vectors)


def gather(work: Work, parts: list[np.ndarray]) -> np.ndarray:
    """Return the shard outputs as one matrix in text order."""
    out = np.empty((len(work.texts), 384), dtype=np.float32)
    for rows, vectors in zip(work.shards, parts, strict=True):
        out[rows] = vectors
    return out


def run_local(work: Work) -> np.ndarray:
    """The flow's local path: one process, shards one after the other through the engine."""
    encoder = get_encoder(work.spec)
    return gather(work, [encode_texts(encoder, [work.texts[i] for i in rows], work.budget)[0] for rows in work.shards])


def write_shards(work: Work, folder: Path) -> list[str]:
    """Write each shard's texts to folder as Parquet (tasks read their shard, as the flow's do); return the paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for number, rows in enumerate(work.shards):
        path = folder / f"shard-{number:05d}.parquet"
        pq.write_table(pa.table({"text": [work.texts[i] for i in rows]}), path)
        paths.append(str(path))
    return paths


def prefect_runner(work: Work, paths: list[str]) -> Callable[[], np.ndarray]:
    """Return a runner of a minimal flow mapping one encode task per shard through nightscore's task runner."""
    import pyarrow.parquet as pq
    from prefect import flow, task, unmapped
    from prefect.cache_policies import NO_CACHE

    from tasks.runner import SettingsTaskRunner

    @task(name="encode-shard", cache_policy=NO_CACHE)
    def encode_part(path: str, spec: EncoderSpec, budget: int) -> np.ndarray:
        texts = pq.read_table(path, columns=["text"]).column("text").to_pylist()
        return encode_texts(get_encoder(spec), texts, budget)[0]

    @flow(name="bench-ray-encode", task_runner=SettingsTaskRunner(), validate_parameters=False)
    def encode_all(paths: list[str]) -> list[np.ndarray]:
        return encode_part.map(paths, unmapped(work.spec), unmapped(work.budget)).result()

    return lambda: gather(work, encode_all(paths))


class BatchEncoder:
    """Ray Data callable class: holds the encoder (loaded once per actor), embeds one planned batch per call."""

    def __init__(self, spec: EncoderSpec) -> None:
        self.encoder = get_encoder(spec)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, _ = self.encoder.tokenize([str(t) for t in batch["texts"][0]])
        return {"row": np.asarray(batch["rows"][0], dtype=np.int64), "embedding": self.encoder.embed(*self.encoder.collate(ids))}


def planned_batches(work: Work) -> list[dict[str, Any]]:
    """Return the engine's token-budget batches of every shard, as Ray Data rows (row ids and texts)."""
    tokenizer = load_tokenizer(work.spec.model_path)
    items = []
    for rows in work.shards:
        lengths = np.array(
            [min(len(e.ids), work.spec.max_seq_length) for e in tokenizer.encode_batch([work.texts[i] for i in rows])]
        )
        for batch in plan_batches(lengths, work.budget):
            items.append({"rows": rows[batch], "texts": [work.texts[i] for i in rows[batch]]})
    return items


class ShardEncoder:
    """Ray Data callable class: holds the encoder (loaded once per actor), runs the engine over one whole shard per call."""

    def __init__(self, spec: EncoderSpec, budget: int) -> None:
        self.encoder, self.budget = get_encoder(spec), budget

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        vectors, _ = encode_texts(self.encoder, [str(t) for t in batch["texts"][0]], self.budget)
        return {"row": np.asarray(batch["rows"][0], dtype=np.int64), "embedding": vectors}


def shard_items(work: Work) -> list[dict[str, Any]]:
    """Return one Ray Data row per shard (row ids and texts)."""
    return [{"rows": rows, "texts": [work.texts[i] for i in rows]} for rows in work.shards]


def ray_data_runner(work: Work, actors: int, per_shard: bool) -> Callable[[], np.ndarray]:
    """Return a runner of Ray Data map_batches with a pool of encoder actors, one CPU slot each.

    Each call gets one of our planned token-budget batches, or (per_shard) one whole shard that the
    actor batches with the engine.
    """
    import ray

    items = shard_items(work) if per_shard else planned_batches(work)
    fn, kwargs = (ShardEncoder, {"spec": work.spec, "budget": work.budget}) if per_shard else (BatchEncoder, {"spec": work.spec})

    def run() -> np.ndarray:
        ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            fn,
            fn_constructor_kwargs=kwargs,
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=work.spec.num_threads,
            batch_format="numpy",
        )
        out = np.empty((len(work.texts), 384), dtype=np.float32)
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            out[batch["row"]] = batch["embedding"]
        return out

    return run


@contextmanager
def ray_session(args: argparse.Namespace, api_url: str) -> Iterator[float]:
    """Start a local Ray the way the flow's task runner does (workers' env, setup hook); yield its start seconds."""
    import ray

    from core.settings import load_settings
    from tasks.runner import ray_init_kwargs

    os.environ.update(
        NIGHTSCORE_TASK_RUNNER="ray", NIGHTSCORE_NUM_THREADS=str(args.task_threads), NIGHTSCORE_RAY_NUM_CPUS=str(args.ray_cpus)
    )
    kwargs = ray_init_kwargs(load_settings(), api_url)
    started = time.perf_counter()
    ray.init(**kwargs, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield time.perf_counter() - started
    finally:
        ray.shutdown()


@contextmanager
def prefect_api(folder: Path) -> Iterator[tuple[str, float]]:
    """Start a Prefect server on loopback (tests/servers.py) and point this process at it; yield (URL, start s)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.servers import prefect_server

    started = time.perf_counter()
    with prefect_server(folder) as url, temporary_settings(updates={PREFECT_API_URL: url}):
        os.environ["PREFECT_API_URL"] = url
        yield url, time.perf_counter() - started


def render(results: dict[str, Timing], texts: int) -> str:
    """Return the side-by-side table: cold and warm wall seconds, warm texts/s, ratios to local, startup, fidelity."""
    local = results["local"]
    lines = [f"{'mode':<26}{'cold s':>8}{'warm s':>8}{'texts/s':>9}{'vs local':>10}{'startup s':>11}{'max |d|':>10}", "-" * 82]
    for mode, r in results.items():
        diff = float(np.abs(r.vectors - local.vectors).max())
        lines.append(
            f"{mode:<26}{r.cold:>8.2f}{r.warm:>8.2f}{texts / r.warm:>9.1f}{local.warm / r.warm:>9.2f}x"
            f"{r.cold - r.warm:>11.2f}{diff:>10.1e}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None, help="An ST-layout model folder (default: the packaged all-MiniLM-L6-v2).")
    parser.add_argument("--n", type=int, default=2000, help="number of demo texts")
    parser.add_argument("--shard-size", type=int, default=256, help="rows per shard (the flow's NIGHTSCORE_SHARD_SIZE)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the local run")
    parser.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 1, help="CPUs of the local Ray")
    parser.add_argument("--task-threads", type=int, default=1, help="CPUs and torch threads per Ray task/actor")
    return parser.parse_args(argv)


def measure(args: argparse.Namespace, work: Work, folder: Path) -> dict[str, Timing]:
    """Return every mode's timings, local first, in one Ray session."""
    on_ray = replace(work, spec=replace(work.spec, num_threads=args.task_threads))
    results = {"local (engine per shard)": timed_twice(lambda: run_local(work))}
    results["prefect-mapped on ray"] = timed_twice(prefect_runner(on_ray, write_shards(work, folder)))
    actors = max(args.ray_cpus // args.task_threads, 1)
    results["ray data, planned batches"] = timed_twice(ray_data_runner(on_ray, actors, per_shard=False))
    results["ray data, shard per call"] = timed_twice(ray_data_runner(on_ray, actors, per_shard=True))
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; return 0."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    args = parse_args(argv)
    work = make_work(args)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, prefect_api(Path(tmp)) as (url, server_s), ray_session(args, url) as ray_s:
        results = measure(args, work, Path(tmp))
    results = {"local" if k.startswith("local") else k: v for k, v in results.items()}
    model = args.model_dir or "all-MiniLM-L6-v2"
    print(
        f"{len(work.texts)} texts, model {model}, {len(work.shards)} shards of <= {args.shard_size}, "
        f"local: 1 process x {args.threads} threads; ray: {args.ray_cpus} CPUs, {args.task_threads} thread(s) per task/actor"
    )
    print(
        f"load average before/after: {load[0]:.1f}/{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
        "(shared machines: compare within one run)"
    )
    print(
        f"started apart: Prefect server {server_s:.1f}s, Ray {ray_s:.1f}s; cold = first pass (workers/actors start, "
        "model loads), warm = second pass in the same Ray session"
    )
    print(render(results, len(work.texts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
