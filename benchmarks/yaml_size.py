"""Compiled size of every example: lines and bytes, at another revision and here, in one run.

    python benchmarks/yaml_size.py [--against REV]

``--against`` defaults to ``HEAD~1``.  Each side compiles in its own process (the other
revision's ``durapipe`` first on ``sys.path``), exactly as ``durapipe compile`` writes it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from previous import resolve, tree

REPO = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None
from pathlib import Path
from durapipe.compiler import CompileOptions, compile_pipeline, header, to_yaml
from durapipe.dsl import load_path
sizes = {}
for path in sorted(Path("examples").glob("*.pipe")):
    loaded = load_path(str(path))
    result = compile_pipeline(loaded.pipeline, CompileOptions())
    text = to_yaml(result.documents, header(str(path)))
    sizes[path.name] = [text.count("\\n"), len(text.encode("utf-8"))]
print(json.dumps(sizes))
"""


def sizes(tree_dir: str) -> dict[str, list[int]]:
    out = subprocess.run([sys.executable, "-c", CHILD, tree_dir], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    result: dict[str, list[int]] = json.loads(out.splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD~1")
    args = parser.parse_args()
    with tree(args.against) as old_tree:
        before = sizes(str(old_tree))
    after = sizes("")
    rev = resolve(args.against)
    print(f"{'example':<26}{rev + ' lines':>14}{'lines':>8}{rev + ' bytes':>16}{'bytes':>9}"
          f"{'ratio':>7}")
    for name in sorted(after):
        (l0, b0), (l1, b1) = before.get(name, [0, 0]), after[name]
        ratio = f"{l1 / l0:.2f}" if l0 else "new"
        print(f"{name:<26}{l0:>14}{l1:>8}{b0:>16}{b1:>9}{ratio:>7}")
    print(json.dumps({"against": rev, "before": before, "after": after}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
