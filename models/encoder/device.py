"""Where the encoder runs: the torch device, its threads, the kind of machine (CPU model and flags, GPU name)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from core.errors import UsageError


def resolve_device(device: str) -> torch.device:
    """Return the torch device for a setting: auto -> cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("device=cuda was asked for but no CUDA device is available")
    return torch.device(device)


def configure_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads deliberately (default: every core) and return the count."""
    threads = num_threads or os.cpu_count() or 1
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def tokenizer_threads(setting: int | None, device: torch.device) -> int:
    """Return the tokenizer instances to run: the setting, else 1 on CPU (the model needs the cores) and every core
    up to 16 on CUDA (the host's only job there is feeding the GPU)."""
    if setting:
        return setting
    return min(os.cpu_count() or 1, 16) if device.type == "cuda" else 1


def default_token_budget(device: torch.device) -> int:
    """Return the token budget used when neither the spec nor a calibration gives one."""
    return 65536 if device.type == "cuda" else 2048


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile")


def device_kind(device: torch.device, threads: int) -> str:
    """Return a file-safe name of the kind of machine: GPU name, or CPU model + relevant flags + threads."""
    if device.type == "cuda":
        return slug(f"cuda-{torch.cuda.get_device_name(device)}")
    model, flags = cpu_model_and_flags()
    present = [f for f in CPU_FLAGS if f in flags]
    return slug(f"cpu-{model}-{'-'.join(present) or 'baseline'}-{threads}t")


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """Return the CPU's model name ('cpu' when unknown) and its feature flags, from /proc/cpuinfo."""
    model, flags = "cpu", set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name") and model == "cpu":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    return model, flags


def slug(text: str) -> str:
    """Return text made file-safe (letters, digits, _ . -), at most 160 characters."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:160]
