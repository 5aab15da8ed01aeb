"""Optional framework integrations; each module imports its framework when imported itself."""
