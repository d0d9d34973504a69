"""Quantizers: grids, policies, placement rules and patterns, and what changes the graph before the writers (SmoothQuant, bias correction, the overflow guard)."""
