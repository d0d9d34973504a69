"""Per-tensor statistics and the clipping thresholds searched on them."""
