"""A tiny PyTorch Lightning run that checkpoints through durapipe and resumes from last.ckpt.

Prints ``start <global step>`` when training starts, ``step <n>`` after each batch and
``finished <global step>`` at the end.

    DURAPIPE_CHECKPOINT_URI=file:///tmp/ckpt python examples/runtime/lightning_training.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from durapipe import runtime
from durapipe.runtime.integrations.lightning import DurapipeModelCheckpoint, resume_path

HOLD_SECONDS = 120.0


class TinyRegression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, _index: int) -> torch.Tensor:
        features, targets = batch
        return torch.nn.functional.mse_loss(self.layer(features), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Progress(pl.Callback):
    def __init__(self, step_seconds: float, hold_at: int | None = None) -> None:
        self.step_seconds = step_seconds
        self.hold_at = hold_at

    def on_train_start(self, trainer: pl.Trainer, _module: pl.LightningModule) -> None:
        print(f"start {trainer.global_step}", flush=True)

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        print(f"step {trainer.global_step}", flush=True)
        time.sleep(self.step_seconds)
        if trainer.global_step == self.hold_at:
            runtime.wait_for_stop(HOLD_SECONDS)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    # A test preempts the run at a known step, however slow the machine, by holding it there.
    parser.add_argument("--hold-at", type=int, default=None,
                        help="after this step, wait up to 120 s for a stop request")
    options = parser.parse_args()

    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(64, 8, generator=generator)
    targets = features.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(features, targets), batch_size=8)

    checkpoint = runtime.context().checkpoint
    assert checkpoint is not None, "DURAPIPE_CHECKPOINT_URI is not set"
    trainer = pl.Trainer(
        max_epochs=options.epochs,
        callbacks=[
            DurapipeModelCheckpoint(checkpoint, dirpath=tempfile.mkdtemp(prefix="pl-")),
            Progress(options.step_seconds, options.hold_at),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    try:
        trainer.fit(TinyRegression(), loader, ckpt_path=resume_path(checkpoint))
    finally:
        # On SIGTERM Lightning ends fit with SIGTERMException (a SystemExit) after our
        # callback's final save.
        if runtime.stop_requested():
            print(f"stopped at {trainer.global_step}", flush=True)
        else:
            print(f"finished {trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
