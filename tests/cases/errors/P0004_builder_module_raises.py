"""A builder module whose own code fails before it defines `pipeline`."""

from durapipe.dsl.builder import Pipeline

p = Pipeline("demo")
steps = {"prep": 1}
p.stage("train", image="x", command=["python", "train.py", str(steps["train"])])
pipeline = p
