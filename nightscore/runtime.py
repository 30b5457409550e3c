"""Process-wide runtime defaults set before Prefect or the model libraries are imported."""

from __future__ import annotations

import logging
import os

from nightscore.settings import Settings


def configure_runtime(settings: Settings) -> None:
    """Set Prefect's and Hugging Face's process defaults (never overriding what the user set).

    Prefect runs in its local ephemeral mode unless PREFECT_API_URL is set; telemetry is off and the
    temporary server gets a startup timeout long enough for a slow 2-core machine. Model libraries are
    told they are offline: the encoder's files ship inside a package, nothing may be downloaded.
    """
    defaults = {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(settings.prefect_startup_timeout_s),
        "PREFECT_UI_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "true",
    }
    for name, value in defaults.items():
        os.environ.setdefault(name, value)


class RunNameFilter(logging.Filter):
    """Adds ``record.run`` (" [task run name]" or " [flow run name]" from Prefect's run loggers, else "")."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Return True (keep every record) after setting its ``run`` field."""
        name = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None)
        record.run = f" [{name}]" if name else ""
        return True


def configure_logging(verbose: bool = False) -> None:
    """Send nightscore's logs to stderr at INFO (DEBUG when verbose), naming the Prefect run a record comes from."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s%(run)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RunNameFilter())
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
