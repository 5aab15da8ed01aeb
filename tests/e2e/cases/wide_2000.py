"""2,000 stages, five levels (1, 10, 100, 1,000 and 889): cases/wide_2000.toml."""

from tests.e2e.cases.tree_pipeline import tree

pipeline = tree("wide-e2e", "e2e-wide", 2000)
