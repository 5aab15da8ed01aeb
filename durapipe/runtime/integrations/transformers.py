"""Hugging Face ``Trainer``: mirror ``output_dir`` to the durapipe checkpoint after each save.

    checkpoint = durapipe.runtime.context().checkpoint
    trainer = Trainer(..., callbacks=[DurapipeTrainerCallback(checkpoint)])
    trainer.train(resume_from_checkpoint=resume_path(checkpoint))

``resume_path`` restores the tree and returns the newest ``checkpoint-<step>`` directory.  When
a stop is requested (SIGTERM) the callback asks the Trainer to save and stop at the end of the
current step; the save is mirrored and uploaded before training ends.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from durapipe.runtime.checkpoint import Checkpoint, latest_checkpoint
from durapipe.runtime.sdk import stop_requested

_STEP_DIR = re.compile(r"^checkpoint-(\d+)$")


def resume_path(checkpoint: Checkpoint | None) -> str | None:
    """The newest ``checkpoint-<step>`` directory of the restored tree, or ``None``."""
    if checkpoint is None:
        return None
    root = checkpoint.load_sync()
    if root is None or not root.is_dir():
        return None
    found = latest_checkpoint(
        root,
        "checkpoint-*",
        key=lambda p: int(m.group(1)) if (m := _STEP_DIR.match(p.name)) else -1,
    )
    return str(found) if found and _STEP_DIR.match(found.name) else None


class DurapipeTrainerCallback(TrainerCallback):
    def __init__(self, checkpoint: Checkpoint, output_dir: str | Path | None = None) -> None:
        self._checkpoint = checkpoint
        self._output_dir = Path(output_dir) if output_dir is not None else None

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> TrainerControl:
        if stop_requested():
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if state.is_world_process_zero:
            directory = self._output_dir or Path(args.output_dir or ".")
            self._checkpoint.save(directory, metadata={"step": state.global_step})

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        self._checkpoint.flush()
