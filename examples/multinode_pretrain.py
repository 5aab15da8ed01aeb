"""Builder twin of multinode_pretrain.pipe."""

from durapipe.dsl.builder import Checkpoint, Distributed, Gpu, Pipeline, Resources

p = Pipeline("pretrain-7b", namespace="ml-training", storage="s3://acme-ml/durapipe",
             service_account="trainer", profile="generic",
             labels={"team": "foundation-models"})
step_seconds = p.param("step_seconds", float, default=0)  # the toy's stand-in for a step

p.stage(
    "pretrain",
    image="ghcr.io/acme/pretrain:0.9.1",
    command=["python", "pretrain.py", "--config", "configs/7b.yaml", "--step-seconds",
             step_seconds],
    resources=Resources(cpu=96, memory="1Ti", shm="128Gi", gpu=Gpu(count=8, types=["H100"])),
    distributed=Distributed(replicas=4, procs_per_node=8, launcher="torchrun", max_restarts=2),
    checkpoint=Checkpoint(path="/checkpoints", keep=5, scope="pipeline"),
    timeout="72h",
)

pipeline = p
