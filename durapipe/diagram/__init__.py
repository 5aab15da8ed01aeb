"""Pictures and summaries of a pipeline: ``durapipe graph`` and the editor's hover text."""
