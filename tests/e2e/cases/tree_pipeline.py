"""The pipelines of the wide cases (wide_400.py, wide_2000.py): a tree, ten children per stage.

Stage ``s<i>`` reads the output of ``s<(i-1)//10>``: each level runs side by side once its
parents are done, so a run takes minutes on the e2e cluster where a chain of as many stages
would take hours. Data crosses every cut between parts; every 400th stage is cached, so
content hashes cross cuts too.
"""

from durapipe.dsl.builder import Cache, Pipeline, Resources, Retry

FAN_OUT = 10


def tree(name: str, namespace: str, n: int) -> Pipeline:
    p = Pipeline(name, namespace=namespace, storage="s3://acme-ml/durapipe")
    epochs = p.param("epochs", int, default=1)
    p.defaults(image="ghcr.io/acme/step:1.0", retry=Retry(attempts=0),
               resources=Resources(cpu=0.1, memory="64Mi"))
    stages = []
    for i in range(n):
        command = ["python", "step.py", "--epochs", epochs, "--out", "/out/data"]
        if i:
            command += ["--in", stages[(i - 1) // FAN_OUT].outputs.data]
        stages.append(p.stage(f"s{i}", command=command, outputs={"data": "/out/data"},
                              cache=Cache() if i % 400 == 399 else None))
    return p
