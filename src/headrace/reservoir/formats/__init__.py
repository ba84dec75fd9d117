"""The reservoir's byte formats: data files, checkpoints, registry (docs/formats/reservoir-*.md)."""
