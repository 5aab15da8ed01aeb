"""Builder twin of spot_training.pipe."""

from durapipe.dsl.builder import Checkpoint, CheckpointGc, Gpu, Pipeline, Resources, Retry

p = Pipeline("spot-training", namespace="ml-training", storage="s3://acme-ml/durapipe",
             profile="eks", checkpoint_gc=CheckpointGc(schedule="0 3 * * *", max_age="14d"))
epochs = p.param("epochs", int, default=10)
lr = p.param("lr", float, default=0.001)
dataset = p.param("dataset", str, default="s3://acme-ml/datasets/imagenet-subset")
epoch_seconds = p.param("epoch_seconds", float, default=0)  # the toy's stand-in for an epoch

p.stage(
    "train",
    image="ghcr.io/acme/trainer:2.3.0",
    command=["python", "train.py", "--data", dataset, "--epochs", epochs, f"--lr={lr}",
             "--epoch-seconds", epoch_seconds],
    resources=Resources(cpu=8, memory="64Gi", gpu=Gpu(count=1, types=["A10G"])),
    interruptible=True,
    last_attempt_on_demand=True,
    retry=Retry(attempts=2, preemptions=10, backoff="30s"),
    checkpoint=Checkpoint(path="/checkpoints", keep=3),
    timeout="12h",
)

pipeline = p
