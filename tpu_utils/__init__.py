"""Distribution machinery, generic first, the TPU-only part apart in `tpu_utils/tpu/`.

Generic (every strategy): `strategy.py` picks and builds the tf.distribute strategy (the one place that touches
resolvers and TF_CONFIG), `tf_config.py` validates TF_CONFIG, `loop.py` is the on-device `tf.range` loop and its
collectives, `deadline.py` bounds a start-up that never answers.

TPU-only (`tpu/`): the runtime facts and start-up decision made before TensorFlow loads (`facts.py`,
`generations.py`, `startup.py`) and resolver connect and TPU system initialisation (`initialize.py`). Launchers live
in scripts/ (an extra).
"""
