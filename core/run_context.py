"""Identity and lake layout of one scoring run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, time, timedelta

from core.errors import UsageError
from core.settings import Settings

NO_INPUTS = (
    "no inputs to score: give --items and --interactions (flow parameters items_uri, interactions_uri) or set "
    "NIGHTSCORE_ITEMS_URI and NIGHTSCORE_INTERACTIONS_URI; `nightscore run nightly --demo` scores the demo data"
)


@dataclass(frozen=True)
class RunContext:
    """A run's id, date, inputs and folder in the lake; small and JSON-able so tasks can pass it."""

    run_id: str
    flow_name: str
    run_date: str  # YYYY-MM-DD
    items_uri: str
    interactions_uri: str
    run_root: str  # <lake>/runs/<run_date>/<run_id>
    started_at: str  # ISO-8601 UTC

    def path(self, name: str) -> str:
        """Return the URI of a file in the run's folder."""
        return f"{self.run_root}/{name}"

    @property
    def date(self) -> date:
        """Return run_date as a date."""
        return date.fromisoformat(self.run_date)

    @property
    def reference_time(self) -> datetime:
        """Return the end of the run date (UTC): interactions are aged from here."""
        return datetime.combine(self.date + timedelta(days=1), time(), tzinfo=UTC)

    def as_dict(self) -> dict[str, str]:
        """Return the context as a plain dict."""
        return asdict(self)


def parse_run_date(value: str | date | None, today: date) -> str:
    """Return a valid YYYY-MM-DD run date (today when value is None); bad input raises UsageError."""
    if value is None:
        return today.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError as exc:
        raise UsageError(f"run date {value!r} is not a YYYY-MM-DD date") from exc


def make_run_id(flow_name: str, run_date: str, unique: str) -> str:
    """Return a run id: <flow>-<run_date>-<8 hex chars of a unique token>."""
    return f"{flow_name}-{run_date}-{unique.replace('-', '')[:8]}"


def run_folder(lake_uri: Callable[..., str], run_date: str, run_id: str) -> str:
    """Return the lake folder of a run: <lake>/runs/<run_date>/<run_id> (lake_uri is Lake.uri)."""
    return lake_uri("runs", run_date, run_id)


def run_inputs(settings: Settings, items_uri: str | None, interactions_uri: str | None) -> tuple[str, str]:
    """Return the run's input URIs: both given, else both of the settings (NIGHTSCORE_ITEMS_URI, ..._INTERACTIONS_URI).

    Never demo data: a run with no inputs anywhere is refused (UsageError, exit 2), naming the settings to set.
    """
    if items_uri or interactions_uri:
        if not (items_uri and interactions_uri):
            raise UsageError("give both items and interactions, or neither (the run then reads NIGHTSCORE_ITEMS_URI ...)")
        return items_uri, interactions_uri
    configured = settings.lake.items_uri, settings.lake.interactions_uri
    if configured[0] and configured[1]:
        return configured[0], configured[1]
    raise UsageError(NO_INPUTS)
