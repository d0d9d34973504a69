"""Calibration and held-out inputs: image folders, .npy/.npz folders, in-memory loaders."""
