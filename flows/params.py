"""Parameters of the deployed flows: pydantic models whose descriptions and defaults fill the UI's run form.

No prefect import here: the CLI and services validate a request with these models before they submit it.
Their JSON schema is also what the Prefect server enforces at submission (deployments/deploy.py makes it
strict), so every rule that JSON Schema can state is stated in it too: the date format and range, the
callback's scheme and literal internal addresses, non-empty item ids, no unknown fields. Rules across fields
(a nightly's or backfill's inputs both or neither, end_date after start_date) are pydantic's alone: a run that breaks them fails
as soon as it starts, before any work.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from core.settings import current_settings
from tasks.callback import UnsafeCallback, check_callback_url

RUN_DATE_HELP = "Run date YYYY-MM-DD; empty = today (UTC). A run_date published again replaces its rows."
CALLBACK_HELP = (
    "Optional http(s) URL: when the run ends the run POSTs {flow_run_id, run_id, state, counts, tables} to "
    "it. Loopback, link-local and private addresses are refused unless NIGHTSCORE_CALLBACK_ALLOW_PRIVATE."
)
BOTH_INPUTS = "give both items_uri and interactions_uri, or neither for the configured ones (NIGHTSCORE_ITEMS_URI, ...)"
FIRST_DATE, LAST_DATE = date(1900, 1, 1), date(2999, 12, 31)
DATE_PATTERN = r"^(19[0-9]{2}|2[0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
CALLBACK_PATTERN = r"^[hH][tT][tT][pP][sS]?://[^/?#\s]+([/?#]\S*)?$"
# Literal hosts a callback may not name (JSON Schema can tell no more; the worker checks resolved names too):
# localhost, 127/8, 10/8, 0/8, 169.254/16, 192.168/16, 172.16/12, 100.64/10, all-digit, hex or octal IPv4
# forms, and the IPv6 ranges whose first group is 0 (loopback, unspecified, IPv4-mapped and -compatible),
# unique-local and link-local, and every NAT64 (64:ff9b::), 6to4 (2002::) and Teredo (2001:0::) literal: the
# schema cannot read the IPv4 address inside (pydantic and the worker refuse only those carrying an internal one).
INTERNAL_HOST_PATTERN = (
    r"^[a-zA-Z][a-zA-Z0-9+.-]*://([^/?#@]*@)?("
    r"[lL][oO][cC][aA][lL][hH][oO][sS][tT]([.:/?#]|$)|[^/?#:]*\.[lL][oO][cC][aA][lL][hH][oO][sS][tT]([:/?#]|$)|"
    r"127\.|10\.|0\.|169\.254\.|192\.168\.|172\.(1[6-9]|2[0-9]|3[01])\.|100\.(6[4-9]|[7-9][0-9]|1[01][0-9]|12[0-7])\.|"
    r"[0-9]+([/?#:]|$)|0[xX0-9]|"
    r"\[(:|0+:|0{0,2}64:[fF]{2}9[bB]:|2002:|2001:0*:|[fF][cCdD]|[fF][eE][89aAbB]))"
)
DATE_SCHEMA: dict[str, Any] = {"pattern": DATE_PATTERN}
CALLBACK_SCHEMA: dict[str, Any] = {"pattern": CALLBACK_PATTERN, "not": {"type": "string", "pattern": INTERNAL_HOST_PATTERN}}
ITEM_IDS_SCHEMA: dict[str, Any] = {"minItems": 1, "items": {"type": "string", "pattern": r"\S"}}


def checked_date(value: Any) -> Any:
    """Return a run date as given when it is YYYY-MM-DD between 1900-01-01 and 2999-12-31; raise ValueError otherwise."""
    if isinstance(value, str) and not re.fullmatch(DATE_PATTERN, value):
        raise ValueError(f"{value!r} is not a YYYY-MM-DD date between {FIRST_DATE} and {LAST_DATE}")
    if isinstance(value, date) and not FIRST_DATE <= value <= LAST_DATE:
        raise ValueError(f"{value} is outside {FIRST_DATE}..{LAST_DATE}")
    return value


def checked_callback(value: HttpUrl | None) -> HttpUrl | None:
    """Return a callback URL nightscore may call (http(s), no literal internal address unless allowed)."""
    if value is not None:
        try:
            check_callback_url(str(value), current_settings().ops.callback_allow_private)
        except UnsafeCallback as exc:
            raise ValueError(str(exc)) from None
    return value


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("run_date", "start_date", "end_date", mode="before", check_fields=False)
    @classmethod
    def _date_in_range(cls, value: Any) -> Any:
        return checked_date(value)

    @field_validator("callback_url", mode="after", check_fields=False)
    @classmethod
    def _safe_callback(cls, value: HttpUrl | None) -> HttpUrl | None:
        return checked_callback(value)


class NightlyParams(_Params):
    """Parameters of the nightly run (all optional: the schedule runs it with none)."""

    run_date: date | None = Field(None, description=RUN_DATE_HELP, json_schema_extra=DATE_SCHEMA)
    items_uri: str | None = Field(
        None, description="Items Parquet (local path or s3://); empty = NIGHTSCORE_ITEMS_URI (none: refused)."
    )
    interactions_uri: str | None = Field(None, description="Interactions Parquet; give it together with items_uri.")
    resume: str | None = Field(
        None, description="RUN_ID of an unfinished run to resume; empty = the unfinished run of the same date and inputs."
    )
    callback_url: HttpUrl | None = Field(None, description=CALLBACK_HELP, json_schema_extra=CALLBACK_SCHEMA)

    @model_validator(mode="after")
    def _both_inputs(self) -> NightlyParams:
        if bool(self.items_uri) != bool(self.interactions_uri):
            raise ValueError(BOTH_INPUTS)
        return self


class OnDemandParams(_Params):
    """Parameters of an on-demand run: score the given items now and publish like a nightly run."""

    items_uri: str | None = Field(None, description="Items Parquet to score; empty = the latest published run's items.")
    interactions_uri: str | None = Field(
        None, description="Interactions Parquet; empty = the latest published run's interactions."
    )
    item_ids: list[str] | None = Field(
        None,
        description="Add or replace only these items of items_uri in the latest published catalog and publish "
        "the whole catalog (unchanged items reuse their vectors). Empty = score items_uri as it is.",
        json_schema_extra=ITEM_IDS_SCHEMA,
    )
    run_date: date | None = Field(None, description=RUN_DATE_HELP, json_schema_extra=DATE_SCHEMA)
    callback_url: HttpUrl | None = Field(None, description=CALLBACK_HELP, json_schema_extra=CALLBACK_SCHEMA)

    @field_validator("item_ids")
    @classmethod
    def _some_ids(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not [v for v in value if v.strip()]:
            raise ValueError("item_ids, when given, must hold at least one non-blank id")
        return value


class BackfillParams(_Params):
    """Parameters of a backfill: one nightly child run per run_date from start_date to end_date, in order."""

    start_date: date = Field(..., description="First run date (YYYY-MM-DD), inclusive.", json_schema_extra=DATE_SCHEMA)
    end_date: date = Field(..., description="Last run date (YYYY-MM-DD), inclusive.", json_schema_extra=DATE_SCHEMA)
    items_uri: str | None = Field(None, description="Items Parquet for every date; empty = NIGHTSCORE_ITEMS_URI (none: refused).")
    interactions_uri: str | None = Field(None, description="Interactions Parquet for every date.")

    @model_validator(mode="after")
    def _ordered(self) -> BackfillParams:
        if self.end_date < self.start_date:
            raise ValueError("end_date is before start_date")
        if (self.end_date - self.start_date).days >= 366:
            raise ValueError("a backfill covers at most 366 dates; split it")
        if bool(self.items_uri) != bool(self.interactions_uri):
            raise ValueError(BOTH_INPUTS)
        return self


class TrainRankerParams(_Params):
    """Parameters of the ranker training run."""

    run_id: str | None = Field(None, description="Published run to train on; empty = the latest published run.")
