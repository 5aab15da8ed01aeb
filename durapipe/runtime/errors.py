"""The errors of the checkpoint store, one family: every one is a :class:`CheckpointError`."""

from __future__ import annotations


class CheckpointError(Exception):
    """Checkpoints exist but none could be restored, or a save failed."""



class LineTakenOver(CheckpointError):  # noqa: N818 (reads as what happened to the writer)
    """Another writer claimed this checkpoint line after this one: this one may not commit."""


class LineBusy(CheckpointError):  # noqa: N818 (reads as what the line is)
    """Another run, still alive (its lease renewed), holds this checkpoint line: this run may
    not write it.  The message says which run, where, and what to do."""


class BlobMissing(CheckpointError):
    """A blob just uploaded is not in the store as written: worth committing again."""


class CheckpointDeadlineExceeded(CheckpointError, TimeoutError):
    """A save was not committed within its bound (derived from the pod's grace period)."""
