"""The language's block vocabulary as paths, for tests that try every attribute."""

from __future__ import annotations

from collections.abc import Iterator

from durapipe.dsl import tree_to_data as td

Kind = td.Kind


def schema_paths(schema: dict[str, Kind],
                 prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Kind]]:
    """Every name a block allows, nested ones included: ``(("resources", "gpu", "count"),
    Attr())``; a nested block comes after its members."""
    for name, kind in schema.items():
        if isinstance(kind, td.BlockSchema):
            yield from schema_paths(kind.schema, (*prefix, name))
        yield (*prefix, name), kind
