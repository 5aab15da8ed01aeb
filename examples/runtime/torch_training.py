"""A small PyTorch CPU training run that resumes bit-identically through durapipe checkpoints.

Everything that makes training non-deterministic across a restart is checkpointed: model,
optimizer (Adam moments), LR scheduler, dropout RNG (torch's global generator) and the
data order (a dedicated loader generator, reseeded per epoch, plus the batch index reached).

    DURAPIPE_CHECKPOINT_URI=file:///tmp/ckpt python examples/runtime/torch_training.py --out w.pt

Prints ``step <n>`` after every optimizer step; saves a checkpoint every ``--every`` steps and
when a stop is requested; at the end writes the final model and optimizer state to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from durapipe import runtime

HOLD_SECONDS = 120.0
from durapipe.runtime.integrations.torch import TrainingState


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, object, TensorDataset]:
    torch.manual_seed(seed)
    features = torch.randn(256, 20)
    labels = (features[:, :4].sum(dim=1) > 0).long() + 2 * (features[:, 4] > 0).long()
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    return model, optimizer, scheduler, TensorDataset(features, labels)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    # A test preempts the run at a known step, however slow the machine, by holding it there.
    parser.add_argument("--hold-at", type=int, default=None,
                        help="after this step, wait up to 120 s for a stop request")
    parser.add_argument("--out", required=True)
    options = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model, optimizer, scheduler, dataset = build(options.seed)
    loader_generator = torch.Generator()
    loader = DataLoader(dataset, batch_size=16, shuffle=True, generator=loader_generator)
    state = TrainingState(
        model, optimizer, scheduler=scheduler, generators={"loader": loader_generator}
    )

    ctx = runtime.context()
    checkpoint = ctx.checkpoint
    assert checkpoint is not None, "DURAPIPE_CHECKPOINT_URI is not set"
    restored = checkpoint.load()
    progress = state.restore(restored) if restored else {"step": 0, "epoch": 0, "data_position": 0}
    step, start_epoch, skip = progress["step"], progress["epoch"], progress["data_position"]
    print(f"resumed at {step}", flush=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    staging = tempfile.mkdtemp(prefix="torch-state-")

    for epoch in range(start_epoch, options.epochs):
        if epoch != start_epoch or not restored:
            # The data order of each epoch depends only on the epoch; a resumed epoch restored
            # the generator as it was at that epoch's start and skips what it already did.
            loader_generator.manual_seed(options.seed * 1000 + epoch)
            skip = 0
        epoch_start_state = loader_generator.get_state()
        for batch_index, (features, labels) in enumerate(loader):
            if batch_index < skip:
                continue
            model.train()
            optimizer.zero_grad()
            loss_fn(model(features), labels).backward()
            optimizer.step()
            scheduler.step()  # type: ignore[attr-defined]
            step += 1
            print(f"step {step}", flush=True)
            time.sleep(options.step_seconds)
            if step == options.hold_at:
                ctx.wait_for_stop(HOLD_SECONDS)
            stopping = ctx.stop_requested()
            if step % options.every == 0 or stopping:
                # Save the loader generator as it was when this epoch's order was drawn.
                current = loader_generator.get_state()
                loader_generator.set_state(epoch_start_state)
                state.write(staging, step=step, epoch=epoch, data_position=batch_index + 1)
                loader_generator.set_state(current)
                checkpoint.save(staging, metadata={"step": step})
            if stopping:
                checkpoint.close()
                print(f"stopped at {step}", flush=True)
                return 0
        restored = None
    checkpoint.close()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, options.out)
    print(f"finished at {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
