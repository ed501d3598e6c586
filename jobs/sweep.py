"""The `train_sweep` tool: a hyperparameter sweep of `train_model`'s network, as one MCP task across workers.

Each point of the grid is one run of the training loop of `jobs.training` (`train_run`, an ordinary
Celery task, at-least-once: a run whose worker dies resumes from its checkpoint on another), all of
them in parallel on whatever workers consume the queue; then a merge step (`pick_best`) picks the
run with the best validation accuracy and asks once whether to save its model. The task's
statusMessage says how the sweep goes (`3/8 runs done, 2 running, best val_accuracy 0.974`); each
run's result names the worker and the process that trained it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
from collections.abc import Sequence
from typing import Annotated, Any

from celery import chord, group
from pydantic import BaseModel, Field

import mcp_celery
from jobs import app
from jobs.training import Hyperparameters, artifact_dir, checkpoint_path, model_path, train, write_atomically

__all__ = ["GRID_KEYS", "RunResult", "SweepResult", "pick_best", "run_model_name", "train_run", "train_sweep"]

#: The hyperparameters a grid may vary, and the kind of value each takes.
GRID_KEYS = {"hidden_units": int, "alpha": float, "learning_rate_init": float, "seed": int}
MAX_RUNS = 64
SAVE_QUESTION = {
    "type": "object",
    "properties": {"save": {"type": "boolean", "title": "Save the best model", "default": True}},
    "required": ["save"],
}


class RunResult(BaseModel):
    params: dict[str, float | int] = Field(description="the grid point this run trained")
    best_val_accuracy: float
    best_epoch: int
    epochs_run: int
    resumed_from_epoch: int = Field(description="the checkpoint this execution started from; 0 = from scratch")
    worker: str = Field(description="the host that trained it")
    pid: int = Field(description="the worker process that trained it")
    model_file: str = Field(description="its best model, kept until the sweep ends")


class SweepResult(BaseModel):
    runs: list[RunResult] = Field(description="every run that finished, in grid order")
    failed: list[dict[str, Any]] = Field(description="runs that failed (member, task, error)")
    best: RunResult | None = Field(description="the run with the best validation accuracy")
    saved: bool
    artifact_path: str | None = Field(description="the best model (joblib), if the user chose to save it")


def grid_points(grid: dict[str, list[float]]) -> list[dict[str, float | int]]:
    """Every combination of the grid's values, in order (the last key varies fastest).

    Raises:
        mcp_celery.ProtocolError: -32602 for an unknown key, an empty list, or more than MAX_RUNS points.
    """
    unknown = sorted(set(grid) - set(GRID_KEYS))
    if unknown or not grid or any(not values for values in grid.values()):
        raise mcp_celery.ProtocolError(
            -32602, f"grid keys are {sorted(GRID_KEYS)}, each with at least one value (not {unknown or grid})"
        )
    keys = sorted(grid)
    points = [
        {key: GRID_KEYS[key](value) for key, value in zip(keys, values, strict=True)}
        for values in itertools.product(*(grid[key] for key in keys))
    ]
    if len(points) > MAX_RUNS:
        raise mcp_celery.ProtocolError(-32602, f"the grid has {len(points)} points; at most {MAX_RUNS} runs")
    return points


@app.task(acks_late=True, reject_on_worker_lost=True, time_limit=6 * 3600)
def train_run(
    params: dict[str, float | int], epochs: int, samples: int, features: int, patience: int
) -> dict[str, Any]:
    """One run of a sweep (a workflow member): trains, keeps its best model for the merge step."""
    ctx = mcp_celery.current_context()
    task_id = str(train_run.request.id)
    assert ctx is not None
    hyper = Hyperparameters(epochs=epochs, patience=patience, samples=samples, features=features, **params)
    label = "[" + " ".join(f"{key}={value}" for key, value in sorted(params.items())) + "] "
    state, resumed_from = train(ctx, task_id, hyper, label)
    model_file = artifact_dir() / "train_sweep" / "runs" / f"{checkpoint_path(task_id).stem}.joblib"
    write_atomically(state.best_model, model_file)
    # Linked from the sweep's result (a member's artifacts are its MCP task's), whichever run is saved.
    ctx.artifact(run_model_name(params), path=model_file, mime_type="application/octet-stream")
    checkpoint_path(task_id).unlink(missing_ok=True)
    return RunResult(
        params=params,
        best_val_accuracy=round(state.best_val_accuracy, 5),
        best_epoch=state.best_epoch,
        epochs_run=state.epoch,
        resumed_from_epoch=resumed_from,
        worker=socket.gethostname(),
        pid=os.getpid(),
        model_file=str(model_file),
    ).model_dump()


def run_model_name(params: dict[str, float | int]) -> str:
    """The artifact name of one run's model: `model-hidden_units=64-seed=1.joblib`."""
    return "model-" + "-".join(f"{key}={value}" for key, value in sorted(params.items())) + ".joblib"


@app.task
def pick_best(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's merge step: the best run, and once the user says so its model saved."""
    ctx = mcp_celery.current_context()
    assert ctx is not None
    runs = [RunResult.model_validate(result) for result in results]
    best = max(runs, key=lambda run: run.best_val_accuracy, default=None)
    saved_to = None
    if best is not None:
        message = (
            f"{len(runs)} runs done: the best, {best.params}, reached val accuracy {best.best_val_accuracy:.3f}. "
            "Save its model?"
        )
        try:
            answer = ctx.elicit(message, SAVE_QUESTION)
            save = answer.action == "accept" and bool((answer.content or {}).get("save"))
        except mcp_celery.InputNotSupported:
            save = False  # nobody to ask: keep nothing
        if save:
            saved_to = model_path(str(pick_best.request.root_id or pick_best.request.id))
            saved_to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(best.model_file, saved_to)
    for run in runs:  # the runs' models were kept for this step only
        if os.path.exists(run.model_file):
            os.unlink(run.model_file)
    return SweepResult(
        runs=runs,
        failed=ctx.failed_members,
        best=best,
        saved=saved_to is not None,
        artifact_path=None if saved_to is None else str(saved_to),
    ).model_dump()


def best_so_far(members: Sequence[mcp_celery.MemberStatus]) -> str:
    """`3/8 runs done, 2 running, best val_accuracy 0.974`."""
    done = [m for m in members if m.status == "completed" and isinstance(m.result, dict)]
    running = sum(m.status == "working" and m.status_message not in (None, "queued") for m in members)
    words = f"{len(done)}/{len(members)} runs done, {running} running"
    if done:
        words += f", best val_accuracy {max(m.result['best_val_accuracy'] for m in done):.3f}"
    return words


@mcp_celery.tool(app, task_mode="required", workflow_summary=best_so_far)
def train_sweep(
    ctx: mcp_celery.JobContext,
    grid: Annotated[
        dict[str, list[float]],
        Field(description=f"hyperparameter -> values to try, of {sorted(GRID_KEYS)}; every combination runs"),
    ],
    epochs: Annotated[int, Field(ge=1, le=500)] = 10,
    patience: Annotated[int, Field(ge=1)] = 3,
    samples: Annotated[int, Field(ge=1_000, le=5_000_000)] = 100_000,
    features: Annotated[int, Field(ge=4, le=500)] = 40,
) -> SweepResult:
    """Train the network of train_model once per point of a hyperparameter grid, in parallel across the
    workers, then offer to save the best model. Runs that fail are listed; the others still count."""
    runs = [train_run.s(point, epochs, samples, features, patience) for point in grid_points(grid)]
    ctx.run_workflow(chord(group(runs), pick_best.s()), on_failure="partial")
