"""Own-data staging (python -m stage): npz, CSV, TFRecord and image folders into TFDS."""
