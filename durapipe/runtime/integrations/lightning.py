"""PyTorch Lightning: mirror ``ModelCheckpoint``'s directory to the durapipe checkpoint.

    checkpoint = durapipe.runtime.context().checkpoint
    callback = DurapipeModelCheckpoint(checkpoint, dirpath="ckpts", save_last=True)
    trainer = L.Trainer(callbacks=[callback], ...)
    trainer.fit(model, loader, ckpt_path=resume_path(checkpoint))

After each epoch's save the directory is handed to ``checkpoint.save`` (staged, then uploaded
in the background, unlike a blocking ``save_sync``).  When a stop is requested (SIGTERM), the
callback writes ``last.ckpt`` at the end of the current batch, hands it over, waits for the
upload and stops the trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from durapipe.runtime.checkpoint import Checkpoint, latest_checkpoint
from durapipe.runtime.sdk import stop_requested


def resume_path(checkpoint: Checkpoint | None, glob_pattern: str = "**/last.ckpt") -> str | None:
    """The newest ``last.ckpt`` of the restored tree, for ``Trainer.fit(ckpt_path=...)``."""
    if checkpoint is None:
        return None
    found = latest_checkpoint(checkpoint.load_sync(), glob_pattern)
    return str(found) if found else None


class DurapipeModelCheckpoint(ModelCheckpoint):
    def __init__(self, checkpoint: Checkpoint, *, dirpath: str | Path, **kwargs: Any) -> None:
        kwargs.setdefault("save_last", True)
        super().__init__(dirpath=str(dirpath), **kwargs)
        self._durapipe_checkpoint = checkpoint
        self._stopped = False

    def _mirror(self, trainer: pl.Trainer) -> None:
        if self.dirpath and trainer.is_global_zero and Path(self.dirpath).is_dir():
            self._durapipe_checkpoint.save(
                Path(self.dirpath),
                metadata={"epoch": trainer.current_epoch, "step": trainer.global_step},
            )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        self._mirror(trainer)

    def _final_save(self, trainer: pl.Trainer) -> None:
        """Write ``last.ckpt`` now, hand it over and wait for the upload (once per stop)."""
        if self._stopped or self.dirpath is None:
            return
        self._stopped = True
        trainer.save_checkpoint(str(Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}.ckpt"))
        self._mirror(trainer)
        self._durapipe_checkpoint.flush()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        if stop_requested():
            self._final_save(trainer)
            trainer.should_stop = True

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        # Lightning's own SIGTERM handler ends fit with SIGTERMException at a batch boundary,
        # possibly before on_train_batch_end saw the flag.
        super().on_exception(trainer, pl_module, exception)
        if isinstance(exception, SIGTERMException) or stop_requested():
            self._final_save(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_end(trainer, pl_module)
        self._durapipe_checkpoint.flush()
