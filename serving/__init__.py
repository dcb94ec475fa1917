"""What an export serves, apart from training: the files written beside the SavedModel (metadata, TF Serving warmup
requests, an example request for Vertex AI, model.tflite) and the `python -m tools.predict` command.

docs/serving.md says how each is used.
"""
