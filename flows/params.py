"""Parameters of the deployed flows: pydantic models whose descriptions and defaults fill the UI's run form.

No prefect import here: the CLI and services validate a request with these models before they submit it.
"""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

RUN_DATE_HELP = "Run date YYYY-MM-DD; empty = today (UTC). A run_date published again replaces its rows."
CALLBACK_HELP = "Optional URL: on completion the run POSTs {flow_run_id, run_id, state, counts, tables} to it."


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NightlyParams(_Params):
    """Parameters of the nightly run (all optional: the schedule runs it with none)."""

    run_date: date | None = Field(None, description=RUN_DATE_HELP)
    items_uri: str | None = Field(None, description="Items Parquet (local path or s3://); empty = the demo inputs in the lake.")
    interactions_uri: str | None = Field(None, description="Interactions Parquet; give it together with items_uri.")
    resume: str | None = Field(None, description="RUN_ID of an unfinished run to resume; empty = the unfinished run of the same date and inputs.")
    callback_url: HttpUrl | None = Field(None, description=CALLBACK_HELP)

    @model_validator(mode="after")
    def _both_inputs(self) -> "NightlyParams":
        if bool(self.items_uri) != bool(self.interactions_uri):
            raise ValueError("give both items_uri and interactions_uri, or neither for the demo inputs")
        return self


class OnDemandParams(_Params):
    """Parameters of an on-demand run: score the given items now and publish like a nightly run."""

    items_uri: str | None = Field(None, description="Items Parquet to score; empty = the latest published run's items.")
    interactions_uri: str | None = Field(None, description="Interactions Parquet; empty = the latest published run's interactions.")
    item_ids: list[str] | None = Field(
        None, description="Add or replace only these items of items_uri in the latest published catalog and publish "
        "the whole catalog (unchanged items reuse their vectors). Empty = score items_uri as it is.")
    run_date: date | None = Field(None, description=RUN_DATE_HELP)
    callback_url: HttpUrl | None = Field(None, description=CALLBACK_HELP)

    @field_validator("item_ids")
    @classmethod
    def _some_ids(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not [v for v in value if v.strip()]:
            raise ValueError("item_ids, when given, must hold at least one non-blank id")
        return value


class BackfillParams(_Params):
    """Parameters of a backfill: one nightly child run per run_date from start_date to end_date, in order."""

    start_date: date = Field(..., description="First run date (YYYY-MM-DD), inclusive.")
    end_date: date = Field(..., description="Last run date (YYYY-MM-DD), inclusive.")
    items_uri: str | None = Field(None, description="Items Parquet for every date; empty = the demo inputs.")
    interactions_uri: str | None = Field(None, description="Interactions Parquet for every date.")

    @model_validator(mode="after")
    def _ordered(self) -> "BackfillParams":
        if self.end_date < self.start_date:
            raise ValueError("end_date is before start_date")
        if (self.end_date - self.start_date).days >= 366:
            raise ValueError("a backfill covers at most 366 dates; split it")
        if bool(self.items_uri) != bool(self.interactions_uri):
            raise ValueError("give both items_uri and interactions_uri, or neither for the demo inputs")
        return self


class TrainRankerParams(_Params):
    """Parameters of the ranker training run."""

    run_id: str | None = Field(None, description="Published run to train on; empty = the latest published run.")
