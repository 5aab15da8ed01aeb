"""``durapipe run``: execute a pipeline on this machine with the compiled workflow's semantics.

Stages run as local processes through the in-pod runtime wrapper, each attempt in its own memory
cgroup where the machine allows, with the same retry budgets, OOM ladder, caching keys and
checkpoint resume as on Argo.  Imports: dsl (the model), compiler (cache keys, param rendering),
runtime (the wrapper and its contract).
"""
