"""Extras for gs:// runs (loaded only for gs:// paths): the run lock on GCS and bucket checks."""
