"""The `train_model` tool: a real scikit-learn model, trained epoch by epoch, that survives a worker loss.

The data is generated (`make_classification`, seeded, so nothing is downloaded and every execution of a
task sees the same data); a multi-layer perceptron learns it one epoch per `partial_fit`. After every
epoch the job writes a checkpoint (model, optimizer state, best model so far, history) keyed by the MCP
task id, reports `epoch 7/20, val accuracy 0.953` as the task's `statusMessage`, which is also a cancel
checkpoint, and prints the epoch's metrics as a line of the task's live output (`ctx.output`). Training
stops early after `patience` epochs without an improvement of at least `min_delta`. The best model
(`model.joblib`) and the per-epoch metrics (`metrics.csv`) are attached to the result as artifacts. At
the end the job asks the user whether to save the best model on the worker's disk as well. The
question parks the job after the tool's park window (`mcp_celery.worker.parking`): the training runs
inside `ctx.once`, so the resumed job does not fit the model again; the best model waits on disk.

Delivery: at-least-once (`retry_on_worker_loss=True`: late ack, reject on worker loss). A job whose pool
process dies (OOM killer, SIGKILL) is put back on its queue by its worker at once; when the whole worker
dies (or its machine), the MCP server puts the message back as soon as the job's heartbeat runs out
(MCP_CELERY_WORKER_LOST_TIMEOUT_S, 30 s by default), not after the broker's visibility timeout. Either
way any worker runs it again with the same task id; that execution loads the last checkpoint and carries
on at the next epoch. Answers already given are replayed by mcp-celery, so a re-run does not ask twice.
A job that has lost its worker four times is not run again: its task ends failed.

Needs the `jobs` extra: `pip install -e '.[jobs]'` (scikit-learn).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import hashlib
import io
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import joblib
import numpy as np
from pydantic import BaseModel, Field
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from threadpoolctl import threadpool_limits

import mcp_celery
from jobs import app

__all__ = [
    "METRICS_ARTIFACT",
    "MODEL_ARTIFACT",
    "EpochMetrics",
    "Hyperparameters",
    "TrainingResult",
    "TrainingState",
    "artifact_dir",
    "checkpoint_path",
    "make_dataset",
    "metrics_csv",
    "model_path",
    "train",
    "train_model",
    "write_atomically",
]

#: The artifacts of every finished training: the best model (joblib) and the per-epoch metrics (CSV).
MODEL_ARTIFACT, METRICS_ARTIFACT = "model.joblib", "metrics.csv"
SAVE_QUESTION = {
    "type": "object",
    "properties": {"save": {"type": "boolean", "title": "Save the model", "default": True}},
    "required": ["save"],
}
_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class EpochMetrics(BaseModel):
    epoch: int
    val_accuracy: float
    train_loss: float
    seconds: float = Field(description="wall time of the epoch")
    finished_at: str = Field(description="when the epoch ended, ISO 8601 UTC")


class TrainingResult(BaseModel):
    epochs_run: int
    best_epoch: int
    best_val_accuracy: float
    stopped_early: bool
    resumed_from_epoch: int = Field(description="the checkpoint this execution started from; 0 = from scratch")
    history: list[EpochMetrics]
    saved: bool
    artifact_path: str | None = Field(description="the saved model (joblib), if the user chose to save it")


@dataclass
class TrainingState:
    """Everything a checkpoint holds: enough to continue as if the job had never stopped."""

    fingerprint: str
    model: MLPClassifier
    epoch: int = 0
    best_epoch: int = 0
    best_val_accuracy: float = -1.0
    best_model: MLPClassifier | None = None
    history: list[EpochMetrics] = field(default_factory=list)


@dataclass(frozen=True)
class Dataset:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    classes: np.ndarray


def artifact_dir() -> Path:
    """`JOBS_ARTIFACT_DIR`, or a fixed folder under the system temp dir (fixed, so a re-run finds it)."""
    configured = os.environ.get("JOBS_ARTIFACT_DIR")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "mcp-celery-jobs"


def _file_key(task_id: str) -> str:
    # MCP task ids are URL-safe already; anything else is hashed rather than trusted as a file name.
    return task_id if _SAFE_ID.fullmatch(task_id) else hashlib.sha256(task_id.encode()).hexdigest()


def checkpoint_path(task_id: str) -> Path:
    return artifact_dir() / "train_model" / "checkpoints" / f"{_file_key(task_id)}.joblib"


def trained_path(task_id: str) -> Path:
    """The best model of a finished training, kept until the user says whether to save it."""
    return artifact_dir() / "train_model" / "trained" / f"{_file_key(task_id)}.joblib"


def model_path(task_id: str) -> Path:
    return artifact_dir() / "train_model" / "models" / f"{_file_key(task_id)}.joblib"


def write_atomically(value: Any, path: Path) -> None:
    """A kill during the write leaves the previous file intact: write aside, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    joblib.dump(value, partial)
    os.replace(partial, path)


def _load_checkpoint(path: Path, fingerprint: str) -> TrainingState | None:
    """The checkpoint of an earlier execution of this task, if it trained the same thing."""
    try:
        state = joblib.load(path)
    except FileNotFoundError:
        return None
    if not isinstance(state, TrainingState) or state.fingerprint != fingerprint:
        return None
    return state


def make_dataset(samples: int, features: int, seed: int) -> Dataset:
    x, y = make_classification(
        n_samples=samples,
        n_features=features,
        n_informative=max(features // 2, 2),
        n_classes=4,
        n_clusters_per_class=2,
        flip_y=0.02,
        random_state=seed,
    )
    x_train, x_val, y_train, y_val = train_test_split(x.astype(np.float32), y, test_size=0.2, random_state=seed)
    return Dataset(x_train, y_train, x_val, y_val, np.unique(y))


def _train_one_epoch(state: TrainingState, data: Dataset, min_delta: float) -> EpochMetrics:
    started = time.perf_counter()
    state.model.partial_fit(data.x_train, data.y_train, classes=data.classes)
    accuracy = float(state.model.score(data.x_val, data.y_val))
    state.epoch += 1
    if accuracy > state.best_val_accuracy + min_delta or state.best_model is None:
        state.best_epoch, state.best_val_accuracy = state.epoch, accuracy
        state.best_model = copy.deepcopy(state.model)
    metrics = EpochMetrics(
        epoch=state.epoch,
        val_accuracy=round(accuracy, 5),
        train_loss=round(float(state.model.loss_), 5),
        seconds=round(time.perf_counter() - started, 3),
        finished_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
    )
    state.history.append(metrics)
    return metrics


def metrics_csv(history: list[EpochMetrics]) -> str:
    """The per-epoch metrics as CSV, a header line first."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["epoch", "val_accuracy", "train_loss", "seconds", "finished_at"])
    for m in history:
        writer.writerow([m.epoch, m.val_accuracy, m.train_loss, m.seconds, m.finished_at])
    return out.getvalue()


def epoch_line(metrics: EpochMetrics, epochs: int, best_epoch: int) -> str:
    """`epoch  3/20  val_accuracy 0.9530  train_loss 0.1234  1.52 s  (best)`: one epoch of the live output."""
    best = "  (best)" if metrics.epoch == best_epoch else ""
    return (
        f"epoch {metrics.epoch:>3}/{epochs}  val_accuracy {metrics.val_accuracy:.4f}  "
        f"train_loss {metrics.train_loss:.4f}  {metrics.seconds:.2f} s{best}"
    )


def _ask_to_save(ctx: mcp_celery.JobContext, trained: TrainingResult) -> bool:
    epochs = f"{trained.epochs_run} epochs"
    how = f"stopped early after {epochs}" if trained.stopped_early else epochs
    best = f"best val accuracy {trained.best_val_accuracy:.3f} at epoch {trained.best_epoch}"
    message = f"Training done ({how}): {best}. "
    try:
        answer = ctx.elicit(message + "Save the model?", SAVE_QUESTION)
    except mcp_celery.InputNotSupported:
        return False  # nobody to ask (e.g. `train_model.delay()` outside MCP): keep nothing
    return answer.action == "accept" and bool((answer.content or {}).get("save"))


@dataclass(frozen=True)
class Hyperparameters:
    """What one training run is given (the same always gives the same run: a seeded generator)."""

    epochs: int = 20
    patience: int = 3
    min_delta: float = 0.001
    samples: int = 400_000
    features: int = 40
    hidden_units: int = 128
    alpha: float = 0.0001
    learning_rate_init: float = 0.001
    seed: int = 0

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()


def train(
    ctx: mcp_celery.JobContext, task_id: str, params: Hyperparameters, label: str = ""
) -> tuple[TrainingState, int]:
    """Train epoch by epoch from the last checkpoint of `task_id` (if any); returns the state and the epoch
    it resumed from. A cancel checkpoint before every epoch; the checkpoint is written after each, and a
    line of live output (`label` first: a sweep's runs share their task's output).

    Raises:
        TaskCancelled: the client cancelled the task.
    """
    checkpoint = checkpoint_path(task_id)
    # One job, one core: parallelism comes from the worker's processes; BLAS threads of several
    # pool processes fighting over the same cores made epochs up to 10x slower.
    with threadpool_limits(limits=1):
        ctx.status(f"generating {params.samples:,} examples")
        data = make_dataset(params.samples, params.features, params.seed)
        model = MLPClassifier(
            hidden_layer_sizes=(params.hidden_units,),
            alpha=params.alpha,
            learning_rate_init=params.learning_rate_init,
            batch_size=256,
            random_state=params.seed,
        )
        state = _load_checkpoint(checkpoint, params.fingerprint) or TrainingState(params.fingerprint, model)
        resumed_from = state.epoch
        if resumed_from:
            ctx.status(f"resuming at epoch {resumed_from + 1}/{params.epochs} from a checkpoint")
            ctx.output(f"{label}resuming at epoch {resumed_from + 1}/{params.epochs} from a checkpoint")
        while state.epoch < params.epochs and state.epoch - state.best_epoch < params.patience:
            ctx.check_cancelled()
            metrics = _train_one_epoch(state, data, params.min_delta)
            write_atomically(state, checkpoint)
            ctx.status(f"epoch {metrics.epoch}/{params.epochs}, val accuracy {metrics.val_accuracy:.3f}")
            ctx.output(f"{label}{epoch_line(metrics, params.epochs, state.best_epoch)}")
    return state, resumed_from


@mcp_celery.tool(app, task_mode="required", retry_on_worker_loss=True)
def train_model(
    ctx: mcp_celery.JobContext,
    epochs: Annotated[int, Field(ge=1, le=500)] = 20,
    patience: Annotated[int, Field(ge=1, description="epochs without improvement before stopping")] = 3,
    min_delta: Annotated[float, Field(ge=0, description="smallest val accuracy gain that counts")] = 0.001,
    samples: Annotated[int, Field(ge=1_000, le=5_000_000, description="generated examples")] = 400_000,
    features: Annotated[int, Field(ge=4, le=500)] = 40,
    hidden_units: Annotated[int, Field(ge=1, le=4096)] = 128,
    seed: int = 0,
) -> TrainingResult:
    """Train a neural network classifier on generated data, epoch by epoch, then offer to save it.

    Reports validation accuracy after every epoch, stops early when it stops improving, can be
    cancelled between epochs, and resumes from its last checkpoint if its worker dies.
    """
    params = Hyperparameters(epochs, patience, min_delta, samples, features, hidden_units, seed=seed)
    try:
        # Once per task: the question after it may park the job for hours, and its resume runs this
        # function again from the top; the fitted model waits on disk, not in a worker process.
        trained = TrainingResult.model_validate(ctx.once("trained", lambda: _train_and_keep(ctx, params)))
        kept = trained_path(ctx.task_id)
        saved_to = model_path(ctx.task_id) if _ask_to_save(ctx, trained) else None
        if saved_to is not None and kept.exists():  # not there: an earlier run of this task moved it
            saved_to.parent.mkdir(parents=True, exist_ok=True)
            os.replace(kept, saved_to)
        kept.unlink(missing_ok=True)
        return trained.model_copy(update={"saved": saved_to is not None, "artifact_path": saved_to and str(saved_to)})
    finally:
        # Reached on every ending but a lost process, the one case the checkpoint is kept for.
        checkpoint_path(ctx.task_id).unlink(missing_ok=True)


def _train_and_keep(ctx: mcp_celery.JobContext, params: Hyperparameters) -> dict[str, Any]:
    """Train, keep the best model until the user decides, and return the result (not saved yet) as JSON."""
    state, resumed_from = train(ctx, ctx.task_id, params)
    write_atomically(state.best_model, trained_path(ctx.task_id))
    # Handed over whatever the answer to the question below: the client downloads what the server keeps.
    ctx.artifact(MODEL_ARTIFACT, path=trained_path(ctx.task_id), mime_type="application/octet-stream")
    ctx.artifact(METRICS_ARTIFACT, metrics_csv(state.history), mime_type="text/csv")
    return TrainingResult(
        epochs_run=state.epoch,
        best_epoch=state.best_epoch,
        best_val_accuracy=round(state.best_val_accuracy, 5),
        stopped_early=state.epoch < params.epochs,
        resumed_from_epoch=resumed_from,
        history=state.history,
        saved=False,
        artifact_path=None,
    ).model_dump(mode="json")
