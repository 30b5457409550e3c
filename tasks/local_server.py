"""Prefect's temporary local server (its ephemeral mode), started while a command still imports its flow.

Without PREFECT_API_URL, a flow run starts a server process of its own the first time it needs the API and waits for
it to answer: 5.1 s on a 2-core AVX2 EPYC, after the 3 s the nightly flow's modules take to import. Started here
first, the server's process comes up on the second core while this one imports.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect.server.api.server import SubprocessASGIServer

log = logging.getLogger(__name__)


def start_local_server() -> Future[str]:
    """Return the future API URL of this process's flow runs: the configured one, done at once; else Prefect's temporary
    server's, returned once its process exists, with a thread waiting for it to answer (a failure is the future's).

    Prefect keeps one temporary server per process (SubprocessASGIServer is a singleton), so the flow run finds this
    one and starts no other; wait for the future before the run, which would otherwise use a server still starting.
    """
    started: Future[str] = Future()
    configured = prefect_api_url()
    if configured:
        started.set_result(configured)
        return started
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    threading.Thread(target=_start, args=(server, started), name="prefect-server-start", daemon=True).start()
    while server.server_process is None and not started.done():  # the thread's Popen: milliseconds
        time.sleep(0.002)
    return started


def prefect_api_url() -> str | None:
    """Return the Prefect API URL of this process (environment or profile), or None in ephemeral mode."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def _start(server: SubprocessASGIServer, started: Future[str]) -> None:
    """Start Prefect's temporary server and resolve started with its API URL, or with its failure."""
    try:
        server.start()
        started.set_result(server.api_url)
    except BaseException as exc:  # handed to whoever waits for the server
        log.debug("Prefect's temporary server did not start", exc_info=exc)
        started.set_exception(exc)
