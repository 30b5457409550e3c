"""The train_ranker flow: fit the stage-two ranking model on a published run's interactions and scores."""

from __future__ import annotations

from prefect import flow

from tasks.ranking import published_run, train


@flow(name="train-ranker")
def train_ranker(run_id: str | None = None) -> dict[str, object]:
    """Train, version and save the ranker on a published run (the latest by default); return its metrics."""
    run = published_run(run_id)
    return train(run)
