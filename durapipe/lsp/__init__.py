"""An editor's view of .pipe files: the analysis behind `durapipe lsp` (no LSP library here)."""
