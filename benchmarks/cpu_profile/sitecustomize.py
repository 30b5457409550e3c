"""A CPU-time sampling profiler for the load benchmark's servers (benchmarks/ranker_load.py --profile DIR).

Python imports ``sitecustomize`` at start-up from the first folder on sys.path that holds one; the benchmark puts
this folder first on its servers' PYTHONPATH with ``NIGHTSCORE_BENCH_PROFILE`` naming a folder, so this module
acts at import time, and only then. SIGUSR1 starts sampling, SIGUSR2 stops it and writes the samples to
``<folder>/<pid>.txt`` as py-spy's raw format ("frame;frame;... count" lines, outermost frame first), which
``benchmarks/ranker_stages.py --summarise`` sorts into stages.

It samples CPU time (``ITIMER_PROF``: user and system time of the process), not wall time: a worker preempted by
the load generator or Redis on shared cores is not sampled, as a wall-clock sampler (py-spy) samples it at the
line that woke them (a socket write), which then looks far costlier than it is. A sample is taken at the next
bytecode after the timer fires, so a C call's (or a system call's) time counts at the line that made it.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from types import FrameType

PERIOD_S = 0.0005  # of CPU time: 2,000 samples per busy second, a few percent of overhead


def _stack(frame: FrameType | None) -> str:
    """Return a frame's stack as py-spy's raw format writes it: outermost first, "function (file:line)"."""
    frames = []
    while frame is not None:
        frames.append(f"{frame.f_code.co_qualname} ({frame.f_code.co_filename}:{frame.f_lineno})")
        frame = frame.f_back
    return ";".join(reversed(frames))


def _install(folder: Path) -> None:
    """Sample between SIGUSR1 and SIGUSR2; write the samples at SIGUSR2."""
    samples: Counter[str] = Counter()

    def sample(_signum: int, frame: FrameType | None) -> None:
        samples[_stack(frame)] += 1

    def start(_signum: int, _frame: FrameType | None) -> None:
        samples.clear()
        signal.signal(signal.SIGPROF, sample)
        signal.setitimer(signal.ITIMER_PROF, PERIOD_S, PERIOD_S)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        folder.mkdir(parents=True, exist_ok=True)
        lines = [f"{stack} {count}" for stack, count in samples.most_common()]
        (folder / f"{os.getpid()}.txt").write_text("\n".join(lines) + "\n")

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


if os.environ.get("NIGHTSCORE_BENCH_PROFILE"):  # the benchmark's servers only: a no-op everywhere else
    _install(Path(os.environ["NIGHTSCORE_BENCH_PROFILE"]))
