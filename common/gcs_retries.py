"""Shorter retries for TensorFlow's own gs:// client, set before TensorFlow is imported (train.py does it first).

TensorFlow retries a failing GCS request 10 times with back-off up to 32 s (about 3 minutes per failing operation)
and waits up to 120 s for each connection. A run whose bucket is gone then spends minutes in every checkpoint, every
metrics.jsonl append and every TensorBoard flush, without a word (the retries run inside TensorFlow). The run's own
bound, `experiment.storage_timeout_seconds`, can only act between operations; so each operation must give up soon:
with these defaults one failing request is tried 5 times over about 15-20 s.

TensorFlow reads these variables once, when it is imported, before gin has parsed the config; so they are fixed
numbers here, not derived from the timeout. A variable already set in the environment is left as it is (set them
yourself to change them; `GCS_RETRY_CONFIG_MAX_RETRIES=10` restores TensorFlow's own retries).
"""

import os

DEFAULTS = {
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "1000000",  # 1 s before the first retry (TensorFlow's own value).
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "8000000",  # At most 8 s between retries (TensorFlow: 32 s).
    "GCS_RETRY_CONFIG_MAX_RETRIES": "4",  # Then give up: 1 + 2 + 4 + 8 s of back-off (TensorFlow: 10 retries).
    "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "20",  # A connection that does not open (TensorFlow: 120 s).
}


def set_defaults(environ=os.environ) -> dict:
    """Sets each of DEFAULTS that `environ` does not set; returns those it set. Must run before TensorFlow loads."""
    added = {name: value for name, value in DEFAULTS.items() if name not in environ}
    environ.update(added)
    return added
