"""Save and restore everything a PyTorch training loop needs to resume bit-identically.

    from durapipe.runtime.integrations.torch import TrainingState

    state = TrainingState(model, optimizer, scheduler=sched, scaler=scaler,
                          generators={"loader": loader_generator})
    restored = ctx.checkpoint.load()
    progress = state.restore(restored) if restored else {"step": 0, "epoch": 0}
    ...
    ctx.checkpoint.save(state.write(tmp_dir, step=step, epoch=epoch, data_position=batch))

What is captured: the model, optimizer, LR scheduler and AMP ``GradScaler`` state dicts; step,
epoch and a data position chosen by the caller (for example the batch index within the epoch);
and every RNG: Python's ``random``, NumPy's legacy global generator (when NumPy is installed),
torch's CPU generator, each CUDA device's generator, and the named ``torch.Generator`` objects
passed in (data-loader and sampler generators).  The file is written with ``torch.save`` and read
back with ``weights_only=False`` because RNG states are Python objects; only load checkpoints
that your own stages wrote.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "training_state.pt"


def capture_rng_states(generators: Mapping[str, Any] | None = None) -> dict[str, Any]:
    states: dict[str, Any] = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    try:
        import numpy

        states["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(
    states: Mapping[str, Any], generators: Mapping[str, Any] | None = None
) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy

        numpy.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    saved = states.get("generators", {})
    for name, generator in (generators or {}).items():
        if name not in saved:
            raise KeyError(f"checkpoint has no state for generator {name!r}")
        generator.set_state(saved[name])


class TrainingState:
    """The objects of one training loop whose state a checkpoint carries."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Any = None,
        *,
        scheduler: Any = None,
        scaler: Any = None,
        generators: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.generators = dict(generators or {})

    def state_dict(self, **progress: Any) -> dict[str, Any]:
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "rng": capture_rng_states(self.generators),
            "progress": dict(progress),
        }
        for name in ("optimizer", "scheduler", "scaler"):
            component = getattr(self, name)
            if component is not None:
                state[name] = component.state_dict()
        return state

    def write(
        self,
        directory: str | os.PathLike[str],
        *,
        step: int,
        epoch: int = 0,
        data_position: Any = None,
        **extra: Any,
    ) -> Path:
        """Write ``training_state.pt`` into ``directory`` (created) and return the directory."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        state = self.state_dict(step=step, epoch=epoch, data_position=data_position, **extra)
        temporary = target / (STATE_FILE + ".tmp")
        torch.save(state, temporary)
        os.replace(temporary, target / STATE_FILE)
        return target

    def restore(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Load a directory written by :meth:`write` (or the file itself); returns the progress."""
        source = Path(path)
        if source.is_dir():
            source = source / STATE_FILE
        state = torch.load(source, map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        for name in ("optimizer", "scheduler", "scaler"):
            component = getattr(self, name)
            if component is not None:
                if name not in state:
                    raise KeyError(f"checkpoint has no {name} state")
                component.load_state_dict(state[name])
        restore_rng_states(state["rng"], self.generators)
        progress: dict[str, Any] = state["progress"]
        return progress
