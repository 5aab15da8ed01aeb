"""Pipelines built directly as models, one per construct, for focused compiler tests."""

from __future__ import annotations

from durapipe.dsl.model import (
    Cache,
    Checkpoint,
    Cluster,
    Distributed,
    Gpu,
    GpuChoice,
    Interp,
    OnOom,
    Param,
    Pipeline,
    Ref,
    Resources,
    Retry,
    Secret,
    Stage,
)

GI = 2**30


def stage(name: str = "train", **kw: object) -> Stage:
    kw.setdefault("image", "ghcr.io/acme/train:1.0")
    kw.setdefault("command", ("python", "train.py"))
    return Stage(name=name, **kw)  # type: ignore[arg-type]


def pipeline(*stages: Stage, **kw: object) -> Pipeline:
    kw.setdefault("name", "demo")
    return Pipeline(stages=stages, **kw)  # type: ignore[arg-type]


def spot_stage(**kw: object) -> Stage:
    kw.setdefault("retry", Retry(attempts=0, preemptions=5, backoff=30))
    return stage(interruptible=True, **kw)


def ladder_stage(**kw: object) -> Stage:
    return stage(retry=Retry(preemptions=2, on_oom=OnOom(memory=(256 * GI, 512 * GI, 1024 * GI))),
                 checkpoint=Checkpoint(), **kw)


def fallback_gpu(wait: int | None = 1800) -> Gpu:
    return Gpu(count=8, types=(GpuChoice(type="H100", count=8), GpuChoice(type="A100-80GB", count=8)),
               fallback_after=wait)


def prep_train_eval() -> Pipeline:
    return pipeline(
        stage("prep", image="ghcr.io/acme/prep:1", command=(
            "python", "-m", "prep", "--epochs", Ref(path=("params", "epochs")),
            Interp(parts=("--out=", Ref(path=("params", "out")))),
        ), outputs={"data": "/out/data"}, cache=Cache(version="v2", max_age=7 * 86400),
              env={"MODE": "fast", "TOKEN": Secret(name="hf", key="token")}),
        stage("train", command=("python", "train.py", "--data", Ref(path=("prep", "outputs", "data"))),
              outputs={"model": "/out/model"}, cache=Cache()),
        stage("eval", needs=("train",), inputs={"model": Ref(path=("train", "outputs", "model"))},
              cache=Cache(), command=("python", "eval.py")),
        params=(Param(name="epochs", type="int", default=3), Param(name="out", type="str", default="x")),
        storage="s3://bucket/prefix",
    )


__all__ = [
    "GI", "Cache", "Checkpoint", "Cluster", "Distributed", "Gpu", "GpuChoice", "Interp", "OnOom",
    "Param", "Pipeline", "Ref", "Resources", "Retry", "Secret", "Stage", "fallback_gpu",
    "ladder_stage", "pipeline", "prep_train_eval", "spot_stage", "stage",
]


def unbalanced_expression_tags(value: object) -> list[str]:
    """Argo ends a ``{{=`` tag at the first ``}}``: every tag body must be balanced there."""
    found: list[str] = []
    if isinstance(value, dict):
        for item in value.values():
            found += unbalanced_expression_tags(item)
    elif isinstance(value, list):
        for item in value:
            found += unbalanced_expression_tags(item)
    elif isinstance(value, str):
        start = value.find("{{=")
        while start != -1:
            end = value.find("}}", start)
            body = value[start + 3:end]
            depth = 0
            for ch in body:
                depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
            if end == -1 or depth != 0:
                found.append(value)
            start = value.find("{{=", end)
    return found
