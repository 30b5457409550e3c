"""The flow's task runner, chosen from settings when a flow run starts: one local thread, or Ray.

Only the tasks a flow *submits or maps* go through a task runner; tasks it calls directly run in the
flow's own process. In the nightly flow that means the encode shards go to Ray and every other stage
stays on the driver.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from prefect.futures import PrefectFuture, PrefectFutureList
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from core.environment import apply_runtime_defaults, worker_environment
from core.errors import UsageError
from core.logs import configure_logging
from core.settings import Settings, current_settings, load_settings
from models.encoder.device import configure_threads
from tasks.local_server import prefect_api_url

log = logging.getLogger(__name__)

SETUP_HOOK = "tasks.runner.setup_worker"


class SettingsTaskRunner(TaskRunner[PrefectFuture[Any]]):
    """Delegates to ThreadPoolTaskRunner(max_workers=1) or prefect-ray's RayTaskRunner, per NIGHTSCORE_TASK_RUNNER.

    Nothing is read at construction (deployments import the flow as is); settings are read in
    ``__enter__``, when the flow run starts. Under Ray, each submitted task asks for one GPU when the
    cluster has GPUs, else ``num_threads`` CPUs (1 by default).
    """

    def __init__(self) -> None:
        super().__init__()
        self._delegate: TaskRunner[Any] | None = None
        self._options: dict[str, Any] = {}

    @property
    def name(self) -> str:
        """Return the runner's name as Prefect logs it."""
        return "settings"

    def duplicate(self) -> SettingsTaskRunner:
        """Return a fresh, unstarted runner (settings are read again when it starts)."""
        return type(self)()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SettingsTaskRunner)

    __hash__ = None  # type: ignore[assignment]

    def __enter__(self) -> SettingsTaskRunner:
        if in_ray_worker():  # Prefect re-enters the flow's runner around each task it runs on Ray
            return self._start(ThreadPoolTaskRunner(max_workers=1))
        cfg = current_settings()
        self._start(build_runner(cfg))
        self._options = remote_resources(cfg) if cfg.ops.task_runner == "ray" else {}
        log.info("task runner: %s%s", cfg.ops.task_runner, f" (each submitted task: {self._options})" if self._options else "")
        return self

    def _start(self, delegate: TaskRunner[Any]) -> SettingsTaskRunner:
        delegate.__enter__()
        super().__enter__()
        self._delegate, self._options = delegate, {}
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if self._delegate is not None:
                self._delegate.__exit__(*exc_info)
        finally:
            self._delegate = None
            super().__exit__(*exc_info)

    def submit(
        self,
        task: Any,
        parameters: dict[str, Any],
        wait_for: Iterable[PrefectFuture[Any]] | None = None,
        dependencies: dict[str, Any] | None = None,
    ) -> PrefectFuture[Any]:
        """Submit one task run to the delegate (under Ray with this run's resource options)."""
        with self._resources():
            return self._started_delegate().submit(task, parameters, wait_for, dependencies)

    def map(
        self, task: Any, parameters: dict[str, Any], wait_for: Iterable[PrefectFuture[Any]] | None = None
    ) -> PrefectFutureList[Any]:
        """Submit one task run per element of the mapped parameters to the delegate."""
        with self._resources():
            return self._started_delegate().map(task, parameters, wait_for)

    def _started_delegate(self) -> TaskRunner[Any]:
        if self._delegate is None:
            raise RuntimeError("The task runner must be started before submitting work.")
        return self._delegate

    def _resources(self) -> AbstractContextManager[Any]:
        if not self._options:
            return nullcontext()
        from prefect_ray.context import remote_options

        return remote_options(**self._options)


def build_runner(cfg: Settings) -> TaskRunner[Any]:
    """Return the (unstarted) task runner the settings name; ray needs a real Prefect server."""
    if cfg.ops.task_runner == "local":
        # One shard at a time: the encoder already uses every core (or the one GPU).
        return ThreadPoolTaskRunner(max_workers=1)
    api_url = prefect_api_url()
    if not api_url:
        raise UsageError(
            "task_runner=ray needs a Prefect server: set PREFECT_API_URL (without it every Ray worker "
            "would start its own temporary server)"
        )
    from prefect_ray import RayTaskRunner

    client = cfg.ops.ray_address if cfg.ops.ray_address and cfg.ops.ray_address.startswith("ray://") else None
    return RayTaskRunner(address=client, init_kwargs=ray_init_kwargs(cfg, api_url))


def in_ray_worker() -> bool:
    """Return whether this process is a Ray worker (not a driver)."""
    if "ray" not in sys.modules:
        return False
    import ray

    return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE


def ray_init_kwargs(cfg: Settings, api_url: str) -> dict[str, Any]:
    """Return ray.init's keyword arguments: which cluster, and the workers' environment and setup hook."""
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": worker_env(cfg, api_url), "worker_process_setup_hook": SETUP_HOOK}}
    if cfg.ops.ray_address is None:
        # "local" always starts a new Ray here: a bare ray.init() would join any cluster already on the machine.
        kwargs.update(address="local", num_cpus=cfg.ops.ray_num_cpus, include_dashboard=False)
    elif not cfg.ops.ray_address.startswith("ray://"):
        kwargs["address"] = cfg.ops.ray_address
    return kwargs


def shard_threads(cfg: Settings) -> int:
    """Return the CPUs (and torch threads) one shard task gets on a CPU cluster."""
    return cfg.encoder.num_threads or 1


def worker_env(cfg: Settings, api_url: str) -> dict[str, str]:
    """Return the environment of Ray workers: the run's settings as NIGHTSCORE_* variables, the Prefect API, torch threads.

    Credentials are left to each node's own environment (runtime_env is visible in Ray's dashboard).
    """
    # Ray would leave torch at one thread; the Prefect API is the run's, whatever the worker's profile says.
    return worker_environment(cfg, {"NIGHTSCORE_NUM_THREADS": str(shard_threads(cfg)), "PREFECT_API_URL": api_url})


def remote_resources(cfg: Settings) -> dict[str, Any]:
    """Return the Ray options of one shard task: a GPU when the cluster has any, else num_threads CPUs.

    max_calls=0 keeps GPU workers alive between tasks (Ray's default for GPU tasks is a fresh process
    per task), so the encoder cached per process loads once per worker.
    """
    import ray

    if ray.cluster_resources().get("GPU", 0) > 0:
        return {"num_gpus": 1, "max_calls": 0}
    return {"num_cpus": shard_threads(cfg)}


def setup_worker() -> None:
    """Prepare a Ray worker process: nightscore's logs at INFO, offline model libraries, torch threads."""
    cfg = load_settings()
    apply_runtime_defaults(cfg)
    configure_logging(console_level=logging.INFO)  # a Ray worker's console is its log (Ray forwards it to the driver)
    log.info("ray worker %d ready: %d torch threads", os.getpid(), configure_threads(cfg.encoder.num_threads))
