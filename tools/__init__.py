"""Standalone command-line tools: compare runs, check replica invariance, predict, list TPU configs."""
