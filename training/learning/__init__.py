"""The run's maths, what a forker edits: the training step, losses, metrics, optimizers."""
