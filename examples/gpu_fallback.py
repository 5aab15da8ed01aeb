"""Builder twin of gpu_fallback.pipe."""

from durapipe.dsl.builder import Checkpoint, Gpu, Pipeline, Resources, secret

p = Pipeline("llm-finetune", namespace="ml-training", storage="s3://acme-ml/durapipe",
             profile="gke")
base_model = p.param("base_model", str, default="meta-llama/Llama-3.1-8B")
p.stage(
    "finetune",
    image="ghcr.io/acme/llm:2025.06",
    command=["torchrun", "--nproc-per-node=8", "finetune.py", "--model", base_model],
    env={"HF_TOKEN": secret("huggingface", "token"), "WANDB_API_KEY": secret("wandb", "api-key")},
    resources=Resources(
        cpu=96, memory="1Ti", shm="64Gi",
        gpu=Gpu(count=8, types=["H100", "A100-80GB", "A100:16"], fallback_after="30m"),
    ),
    checkpoint=Checkpoint(path="/checkpoints", keep=2),
    timeout="24h",
)

pipeline = p
