"""How long a pod may run on after the kubelet's SIGTERM: a figure both the compiler (the pod's
``terminationGracePeriodSeconds``) and the bound (an attempt that was stopped holds its node
that much longer) read.  No imports, so that the compiler's options stay light."""

from __future__ import annotations

#: Seconds a checkpointing stage's pod gets between SIGTERM and SIGKILL (its final save and
#: upload): the compiler's ``terminationGracePeriodSeconds`` unless told otherwise.
CHECKPOINT_GRACE_SECONDS = 300
#: Kubernetes' ``terminationGracePeriodSeconds`` for a pod that sets none.
KUBERNETES_GRACE_SECONDS = 30


def grace_seconds(checkpointing: bool,
                  checkpoint_grace_seconds: int = CHECKPOINT_GRACE_SECONDS) -> int:
    """How long a stage's pod may keep running after SIGTERM (a preemption, its ``timeout``):
    the compiled grace of a checkpointing stage, else Kubernetes' default."""
    return checkpoint_grace_seconds if checkpointing else KUBERNETES_GRACE_SECONDS
