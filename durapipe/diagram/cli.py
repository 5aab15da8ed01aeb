"""``durapipe graph``: arguments and behaviour (the top-level CLI delegates here)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys


def run(args: argparse.Namespace) -> int:
    from durapipe.diagram import render
    from durapipe.dsl import diagnostics as dg
    from durapipe.dsl import load_path

    loaded = load_path(args.file)
    errors = [d for d in loaded.diagnostics if d.is_error]
    if loaded.pipeline is None or errors:
        print(dg.render(errors or loaded.diagnostics, "human",
                        bool(getattr(sys.stderr, "isatty", lambda: False)())), file=sys.stderr)
        return 1
    if args.format == "mermaid":
        data = render.mermaid(loaded.pipeline).encode("utf-8")
    else:
        data = render.dot(loaded.pipeline).encode("utf-8")
    if args.format == "svg":
        svg = to_svg(data)
        if svg is None:
            return 2
        data = svg
    if args.output:
        from durapipe.files import write_atomic

        write_atomic(args.output, data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0


def to_svg(dot_text: bytes) -> bytes | None:
    """SVG through Graphviz's ``dot``; ``None`` (after saying why) where it is missing."""
    exe = shutil.which("dot")
    if exe is None:
        print("durapipe graph: --format svg needs Graphviz's `dot` on PATH "
              "(e.g. `apt-get install graphviz`); --format dot prints its input",
              file=sys.stderr)
        return None
    done = subprocess.run([exe, "-Tsvg"], input=dot_text, capture_output=True, check=False)
    if done.returncode != 0:
        print(f"durapipe graph: Graphviz `dot` failed: {done.stderr.decode(errors='replace')}",
              file=sys.stderr)
        return None
    return done.stdout
