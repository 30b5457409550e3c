"""The Python steps of benchmarks/gpu_check.sh: what travels to a lent GPU host, and what runs there beside the benchmark.

    python benchmarks/gpu_steps.py prepare [--items 100000] [--out .gpu]  # here: model, texts, wheels; sizes checked
    python3 benchmarks/gpu_steps.py unpack --wheels .gpu/wheels --site DIR  # there: the carried wheels unzipped
    python benchmarks/gpu_steps.py env                                      # Python, torch, device, CPU: one line each
    python benchmarks/gpu_steps.py nightly --items N --users M --work DIR [--texts PATH]
    python benchmarks/gpu_steps.py encode-stage --items N [--texts PATH]    # the nightly's encode stage alone
    python benchmarks/gpu_steps.py nightly-figures LOG N                    # the figures line of a nightly log

The GPU host (docs/gpu.md) has Python 3.12 with torch, transformers, tokenizers, sentence-transformers, numpy,
pyarrow and pandas, reaches no registry, and takes at most 64 MiB per call. The engine's path needs pydantic,
pydantic-settings and platformdirs besides (core/settings.py): they travel as cp312 wheels (about 3 MB), unzipped into a folder on
PYTHONPATH there; nothing is installed into the host's Python. The nightly flow needs polars, Prefect, DuckDB,
pandera and Great Expectations too: polars' runtime wheel alone is 54 MB and DuckDB's 25 MB, more than travels, so
there the nightly step says so and times its encode stage alone (the nightly's GPU work) on the carried texts.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("nightscore"))
RUN_DATE = "2026-11-30"
CARRY_LIMIT = 64 * 2**20  # what one device call takes: the working tree and the carried folders together
# What the engine's path imports that the GPU host lacks (its package list: docs/gpu.md), carried as wheels.
WHEELS = (
    "pydantic",
    "pydantic-core",
    "pydantic-settings",
    "typing-inspection",
    "annotated-types",
    "python-dotenv",
    "typing-extensions",
    "platformdirs",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
NIGHTLY_NEEDS = ("polars", "prefect", "duckdb", "pandera", "great_expectations")
# "run <id> (<date>) published in 12.3s (the run 10.1s, Prefect start-up and the rest 2.2s) on cpu"
SUMMARY = re.compile(r"run \S+ \(\S+\) (\w+) in ([\d.]+)s(?: \(the run ([\d.]+)s[^)]*\))? on (\S+)")
STAGES = re.compile(r"stages \(s\): (.*)")


def prepare(out: Path, items: int) -> int:
    """Write what the GPU host needs into out (model with fp16 weights, demo texts, wheels); return 1 when all that
    travels (the working tree included) is over the 64 MiB a call takes, else 0."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    write_model(out / "model")
    write_texts(out / "texts.parquet", items)
    download_wheels(out / "wheels")
    sizes = {name: folder_bytes(out / name) for name in ("model", "texts.parquet", "wheels")}
    sizes["working tree"] = working_tree_bytes()
    total = sum(sizes.values())
    for name, size in sizes.items():
        print(f"{name:<14}{size / 2**20:8.1f} MiB")
    verdict = "fits" if total <= CARRY_LIMIT else "is OVER"
    print(f"{'total':<14}{total / 2**20:8.1f} MiB: {verdict} the {CARRY_LIMIT // 2**20} MiB one call carries")
    return 0 if total <= CARRY_LIMIT else 1


def write_model(folder: Path) -> None:
    """Copy the packaged model with its weights cast to fp16 (45 MB; every precision is measured against the same)."""
    import torch
    from safetensors.torch import load_file, save_file

    from models.encoder.files import model_dir

    source = model_dir()
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("model.safetensors", "*.md"))
    weights = {k: v.to(torch.float16).contiguous() for k, v in load_file(source / "model.safetensors").items()}
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def write_texts(path: Path, items: int) -> None:
    """Write the texts of `items` demo items (title + body, as the nightly encodes them) as Parquet."""
    from data_contracts.inputs import item_text_expr
    from nightscore.demo import generate_items

    generate_items(items, seed=0).select(item_text_expr()).write_parquet(path, compression="zstd", compression_level=19)


def download_wheels(folder: Path) -> None:
    """Download the cp312 manylinux wheels of WHEELS, at the versions installed here, into folder (no dependencies)."""
    from importlib.metadata import version

    pins = [f"{name}=={version(name)}" for name in WHEELS]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    command += ["--implementation", "cp", *platforms, "-d", str(folder), *pins]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def folder_bytes(path: Path) -> int:
    """Return the bytes of a file, or of every file under a folder."""
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def working_tree_bytes() -> int:
    """Return the bytes of what a device call sends besides the carried folders: tracked and untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
    )
    files = [ROOT / name for name in listed.stdout.decode().split("\0") if name]
    return sum(f.stat().st_size for f in files if f.is_file())


def unpack(wheels: Path, site: Path) -> Path:
    """Unzip every wheel in `wheels` into `site` (a folder for PYTHONPATH) and return it: nothing is installed."""
    site.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    return site


def environment() -> list[str]:
    """Return the host's Python, torch and device, and its CPU (model, cores, the flags that matter to the engine)."""
    import torch

    from models.encoder.device import CPU_FLAGS, cpu_model_and_flags

    model, flags = cpu_model_and_flags()
    lines = [
        f"python {platform.python_version()} ({sys.executable}); torch {torch.__version__}",
        f"cpu {model}, {os.cpu_count()} cores; flags {' '.join(f for f in CPU_FLAGS if f in flags) or '-'}",
    ]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(f"cuda {torch.version.cuda}: {props.name}, {props.total_memory / 2**30:.0f} GiB")
    else:
        lines.append("cuda: none (the CPU runs every step)")
    return lines


def torch_at_least(major: int, minor: int) -> bool:
    """Return whether the torch here is at least major.minor."""
    import torch

    found = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (major, minor)


def load_texts(path: Path | None, items: int) -> list[str]:
    """Return `items` texts: from a Parquet `text` column (cycled when short), else generated demo items."""
    if path is None:
        from data_contracts.inputs import item_text_expr
        from nightscore.demo import generate_items

        return generate_items(items, seed=0).select(item_text_expr()).get_column("text").to_list()
    import pyarrow.parquet as pq  # not polars: the GPU host lacks it

    texts = [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if t]
    return [texts[i % len(texts)] for i in range(items)]


def encode_stage(texts: list[str]) -> str:
    """Return the figures line of the nightly's encode stage run alone: the settings' encoder (auto: its calibration
    in the engine cache, measured now when absent), shards of the settings' size planned as the nightly plans them."""
    import numpy as np

    from core.settings import load_settings
    from models.encoder.batching import assign_shards
    from models.encoder.engine import encode_texts
    from models.encoder.loader import get_encoder
    from models.encoder.spec import EncoderSpec

    settings = load_settings()
    started = time.perf_counter()
    encoder = get_encoder(EncoderSpec.from_settings(settings))
    loaded = time.perf_counter() - started
    lengths = encoder.tokenize_packed(texts).lengths  # planning's own pass over the texts, untimed as in the nightly
    _, shards = assign_shards(lengths, settings.encoder.bucket_boundaries, settings.encoder.shard_size)
    started = time.perf_counter()
    tokens = 0
    for shard in np.unique(shards):
        rows = np.flatnonzero(shards == shard)
        _, stats = encode_texts(encoder, [texts[i] for i in rows])
        tokens += stats.real_tokens
    seconds = time.perf_counter() - started
    per_million = seconds * 1_000_000 / max(len(texts), 1)
    return (
        f"encode stage: {len(texts)} items in {int(shards.max()) + 1} shards of {settings.encoder.shard_size} in {seconds:.1f}s "
        f"({tokens / seconds:,.0f} real tok/s) on {encoder.device} as {encoder.mode.label}, model load and choice "
        f"{loaded:.1f}s; {per_million:.1f} device-seconds per 1M items"
    )


def missing(modules: tuple[str, ...]) -> list[str]:
    """Return the modules that cannot be imported here."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def demo_inputs(folder: Path, items: int, users: int) -> Path:
    """Write demo inputs with the CLI (items.parquet, interactions.parquet) and return the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [CLI, "demo-data", "--out", str(folder), "--items", str(items), "--users", str(users), "--home", str(folder / "home")],
        check=True,
    )
    return folder


def run_nightly(home: Path, inputs: Path, **env: str) -> str:
    """Run `nightscore run nightly` on the inputs; return its output (raise with its tail when it fails)."""
    items, interactions = str(inputs / "items.parquet"), str(inputs / "interactions.parquet")
    command = [
        CLI,
        "run",
        "nightly",
        "--items",
        items,
        "--interactions",
        interactions,
        "--run-date",
        RUN_DATE,
        "--home",
        str(home),
    ]
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"nightly run failed (rc {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout + done.stderr


def figures(log: str, items: int) -> str:
    """Return the figures line of a nightly run: status, wall, stages, device-seconds per 1M items."""
    found = SUMMARY.search(log)
    if not found:
        return "no run summary in the log"
    status, device = found.group(1), found.group(4)
    wall = float(found.group(3) or found.group(2))  # the run's own wall time, without Prefect's start-up
    stages = STAGES.search(log)
    per_million = wall * 1_000_000 / max(items, 1)
    return (
        f"nightly: {items} items {status} in {wall:.1f}s on {device}; {per_million:.0f} device-seconds per 1M items; "
        f"stages (s): {stages.group(1) if stages else '?'}"
    )


def nightly(items: int, users: int, work: Path, texts: Path | None) -> None:
    """Print the nightly's figures where its packages are here, else why it cannot run; then its encode stage alone."""
    lacking = missing(NIGHTLY_NEEDS)
    if lacking:
        print(
            f"nightly: NOT RUN: this host lacks {', '.join(lacking)} and reaches no registry; their wheels do not fit the "
            f"{CARRY_LIMIT // 2**20} MiB a call carries (polars' runtime 54 MB, DuckDB 25 MB): the encode stage alone follows"
        )
    else:
        log = run_nightly(work / "home", demo_inputs(work / "inputs", items, users))
        print(log[-4000:])
        print(figures(log, items))
    print(encode_stage(load_texts(texts, items)))


def main(argv: list[str] | None = None) -> int:
    """Run one step; return its exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, default=ROOT / ".gpu")
    p.add_argument("--items", type=int, default=100_000)
    u = sub.add_parser("unpack")
    u.add_argument("--wheels", type=Path, required=True)
    u.add_argument("--site", type=Path, required=True)
    sub.add_parser("env")
    n = sub.add_parser("nightly")
    n.add_argument("--items", type=int, required=True)
    n.add_argument("--users", type=int, required=True)
    n.add_argument("--work", type=Path, required=True)
    n.add_argument("--texts", type=Path, default=None)
    e = sub.add_parser("encode-stage")
    e.add_argument("--items", type=int, required=True)
    e.add_argument("--texts", type=Path, default=None)
    f = sub.add_parser("nightly-figures")
    f.add_argument("log", type=Path)
    f.add_argument("items", type=int)
    args = parser.parse_args(argv)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if args.step == "prepare":
        return prepare(args.out, args.items)
    if args.step == "unpack":
        print(unpack(args.wheels, args.site))
    elif args.step == "env":
        print("\n".join(environment()))
        if not torch_at_least(2, 11):
            print("torch older than 2.11: the engine's GPU path is not checked on it")
            return 1
    elif args.step == "nightly":
        nightly(args.items, args.users, args.work, args.texts)
    elif args.step == "encode-stage":
        print(encode_stage(load_texts(args.texts, args.items)))
    else:
        print(figures(args.log.read_text(), args.items))
    return 0


if __name__ == "__main__":
    sys.exit(main())
