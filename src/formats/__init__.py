"""Model output formats: one pure module per family (no MLX, no Trio)."""
