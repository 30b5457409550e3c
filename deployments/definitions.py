"""What gets deployed: the four deployments, their queues and schedules (no Prefect import: plain data)."""

from __future__ import annotations

from dataclasses import dataclass

from core.settings import Settings

ON_DEMAND_QUEUE = "on-demand"
SCHEDULED_QUEUE = "scheduled"
# Lower number = higher priority: a worker takes waiting on-demand runs before nightly/backfill ones.
QUEUE_PRIORITIES = {ON_DEMAND_QUEUE: 1, SCHEDULED_QUEUE: 2}


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: its name, the flow's module path, its queue, an optional cron, and a description."""

    name: str
    entrypoint: str  # module path, e.g. flows.nightly.nightly (the package is installed, so any worker imports it)
    queue: str
    cron: str | None
    description: str
    reads_inputs: bool = False  # its runs take the configured inputs by default (NIGHTSCORE_ITEMS_URI, ...)

    @property
    def flow_name(self) -> str:
        """Return the flow's name, which equals the deployment's name here."""
        return self.name


def deployment_specs(settings: Settings) -> list[DeploymentSpec]:
    """Return the deployments nightscore registers: nightly, on-demand, backfill and train-ranker."""
    return [
        DeploymentSpec(
            "nightly",
            "flows.nightly.nightly",
            SCHEDULED_QUEUE,
            settings.ops.nightly_cron,
            "Score the night's inputs and publish item_scores, user_candidates and the candidate cache.",
            reads_inputs=True,
        ),
        DeploymentSpec(
            "on-demand",
            "flows.on_demand.on_demand",
            ON_DEMAND_QUEUE,
            None,
            "Score given inputs (or item ids) now; same tables and cache as nightly.",
        ),
        DeploymentSpec(
            "backfill", "flows.backfill.backfill", SCHEDULED_QUEUE, None, "One nightly child run per run_date of a range."
        ),
        DeploymentSpec(
            "train-ranker",
            "flows.train_ranker.train_ranker",
            SCHEDULED_QUEUE,
            settings.ops.train_ranker_cron,
            "Train the online ranker on the latest published run (weekly).",
        ),
    ]


def deployment_ref(name: str) -> str:
    """Return the '<flow>/<deployment>' name the Prefect API and run_deployment use."""
    return f"{name}/{name}"
