"""Talking to a cluster: ``durapipe submit``, ``status`` and ``watch``.

``api`` is the only module that imports the ``kubernetes`` client (the optional ``cluster``
extra); ``run_status`` reads a Workflow object as durapipe's stages, attempts and budgets (a pure
function, no client); ``submit`` holds the commands.  The package reads the compiler's naming and
retry markers to interpret what the compiler wrote, never the other way round.
"""
