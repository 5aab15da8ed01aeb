"""A tiny Hugging Face Trainer run (BERT built from a config, no downloads) that resumes
from the newest ``checkpoint-<step>`` mirrored to the durapipe checkpoint.

Prints ``resumed from <dir or none>``, ``step <n>`` after each step and ``finished <step>``.

    DURAPIPE_CHECKPOINT_URI=file:///tmp/ckpt python examples/runtime/hf_training.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from durapipe import runtime
from durapipe.runtime.integrations.transformers import DurapipeTrainerCallback, resume_path

HOLD_SECONDS = 120.0


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 60, (64, 12), generator=generator)
        self.labels = (self.ids[:, 0] > 30).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[index],
            "attention_mask": torch.ones_like(self.ids[index]),
            "labels": self.labels[index],
        }


class Progress(TrainerCallback):
    def __init__(self, step_seconds: float, hold_at: int | None = None) -> None:
        self.step_seconds = step_seconds
        self.hold_at = hold_at

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        print(f"step {state.global_step}", flush=True)
        time.sleep(self.step_seconds)
        if state.global_step == self.hold_at:
            runtime.wait_for_stop(HOLD_SECONDS)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    # A test preempts the run at a known step, however slow the machine, by holding it there.
    parser.add_argument("--hold-at", type=int, default=None,
                        help="after this step, wait up to 120 s for a stop request")
    options = parser.parse_args()

    checkpoint = runtime.context().checkpoint
    assert checkpoint is not None, "DURAPIPE_CHECKPOINT_URI is not set"
    resume = resume_path(checkpoint)
    print(f"resumed from {resume or 'none'}", flush=True)
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    output_dir = tempfile.mkdtemp(prefix="hf-")
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=options.max_steps,
        per_device_train_batch_size=8,
        save_strategy="steps",
        save_steps=3,
        save_total_limit=2,
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=42,
    )
    trainer = Trainer(
        model=BertForSequenceClassification(config),
        args=args,
        train_dataset=RandomTokens(),
        callbacks=[
            DurapipeTrainerCallback(checkpoint),
            Progress(options.step_seconds, options.hold_at),
        ],
    )
    trainer.train(resume_from_checkpoint=resume)
    if runtime.stop_requested():
        print(f"stopped at {trainer.state.global_step}", flush=True)
    else:
        print(f"finished {trainer.state.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
