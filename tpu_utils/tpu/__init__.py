"""TPU-only code: start-up decisions (before TensorFlow loads), TPU system initialisation, configs per slice, and
the Cloud TPU VM launcher's helpers. On a host without a TPU only the start-up's look at the host runs (it finds no
chips and sets nothing).
"""
