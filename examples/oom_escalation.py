"""Builder twin of oom_escalation.pipe."""

from durapipe.dsl.builder import OnOom, Pipeline, Resources, Retry

p = Pipeline("feature-build", namespace="ml-data", storage="s3://acme-ml/durapipe")
shards = p.param("shards", int, default=512)
rows = p.param("rows", int, default=200)  # per shard, held in memory at once
p.stage(
    "build-features",
    image="ghcr.io/acme/features:1.8.2",
    command=["python", "-m", "features.build", "--shards", shards, "--rows", rows,
             "--out", "/out/features"],
    resources=Resources(cpu=32),
    retry=Retry(attempts=2, backoff="1m", on_oom=OnOom(memory=["256Gi", "512Gi", "1Ti"])),
    checkpoint=True,
    outputs={"features": "/out/features"},
)

pipeline = p
