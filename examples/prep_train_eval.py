"""Builder twin of prep_train_eval.pipe."""

from durapipe.dsl.builder import Cache, Pipeline, Resources, Retry

p = Pipeline("churn-model", namespace="ml-training", storage="s3://acme-ml/durapipe")
snapshot = p.param("snapshot", str, default="2026-11-01")
max_depth = p.param("max_depth", int, default=8)
# Pinned by digest, as the cache key needs (W0005): the tag for people, the digest for the key.
IMAGE = ("ghcr.io/acme/churn:4.1.0"
         "@sha256:198657d88e13664112ad27589506b9048bbab9027442726be0daca1290e2157f")
p.defaults(image=IMAGE, retry=Retry(attempts=1, backoff="10s"),
           env={"LOG_LEVEL": "info"})

prep = p.stage(
    "prep",
    command=["python", "-m", "churn.prep", "--snapshot", snapshot, "--out", "/out/data"],
    resources=Resources(cpu=4, memory="16Gi"),
    outputs={"data": "/out/data"},
    cache=Cache(max_age="7d"),
)
train = p.stage(
    "train",
    command=["python", "-m", "churn.train", "--data", prep.outputs.data,
             "--max-depth", max_depth, "--out", "/out/model"],
    resources=Resources(cpu=16, memory="64Gi"),
    outputs={"model": "/out/model"},
    cache=Cache(version="2"),
    checkpoint=True,
)
p.stage(
    "eval",
    command=["python", "-m", "churn.eval", "--model", train.outputs.model,
             "--data", prep.outputs.data, "--report", "/out/report"],
    resources=Resources(cpu=4, memory="16Gi"),
    outputs={"report": "/out/report"},
)

pipeline = p
