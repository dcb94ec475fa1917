"""Own-data staging (python -m data.stage): npz, CSV, TFRecord and image folders into TFDS."""
