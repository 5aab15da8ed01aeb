"""Front end: ``.pipe`` text or the Python builder -> a validated :class:`Pipeline`.

Every entry point returns the model *and* diagnostics; user mistakes never raise from here.
"""

from __future__ import annotations

from durapipe.dsl.diagnostics import Diagnostic, PipelineError, Severity, render
from durapipe.dsl.load import LoadResult, load_path, loads
from durapipe.dsl.model import Pipeline, Stage

__all__ = [
    "Diagnostic", "LoadResult", "Pipeline", "PipelineError", "Severity", "Stage", "load_path",
    "loads", "render",
]
