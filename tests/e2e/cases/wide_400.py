"""400 stages, four levels (1, 10, 100 and 289): cases/wide_400.toml."""

from tests.e2e.cases.tree_pipeline import tree

pipeline = tree("wide400-e2e", "e2e-wide400", 400)
