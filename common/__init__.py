"""The leaf every other package may import: errors that carry exit codes, and storage checks and messages.

Nothing here imports the rest of the repository (data/, models/, tasks/, tpu_utils/, training/), so dependencies
point one way: entry points -> training -> data, models, tasks, tpu_utils -> common.
"""
