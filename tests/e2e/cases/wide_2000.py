"""2,000 stages as a tree with ten children per stage (the pipeline of cases/wide_2000.toml).

Stage ``s<i>`` reads the output of ``s<(i-1)//10>``: five levels (1, 10, 100, 1,000 and 889
stages), each running side by side once its parents are done, so the run takes minutes on
the e2e cluster where a 2,000-stage chain would take hours. Data crosses every cut between
parts; every 400th stage is cached, so content hashes cross cuts too.
"""

from durapipe.dsl.builder import Cache, Pipeline, Resources, Retry

FAN_OUT = 10
STAGES = 2000

p = Pipeline("wide-e2e", namespace="e2e-wide", storage="s3://acme-ml/durapipe")
epochs = p.param("epochs", int, default=1)
p.defaults(image="ghcr.io/acme/step:1.0", retry=Retry(attempts=0),
           resources=Resources(cpu=0.1, memory="64Mi"))
stages = []
for i in range(STAGES):
    command = ["python", "step.py", "--epochs", epochs, "--out", "/out/data"]
    if i:
        command += ["--in", stages[(i - 1) // FAN_OUT].outputs.data]
    stages.append(p.stage(f"s{i}", command=command, outputs={"data": "/out/data"},
                          cache=Cache() if i % 400 == 399 else None))

pipeline = p
