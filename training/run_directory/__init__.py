"""The run directory: its layout, checkpoints, exports, history, lock and identity."""
