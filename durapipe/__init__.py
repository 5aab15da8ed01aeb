"""durapipe: durable ML training pipelines, compiled to Argo Workflows."""

__version__ = "0.1.0"
