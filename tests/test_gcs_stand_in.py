"""The loopback GCS server (tests/gcs_server/) is at least as strict as Cloud Storage where the code depends on it:
exact object names, generation preconditions (412), retried 429/503 answers, resumable uploads past the
single-request size. docs/testing.md lists each difference from the real service and the test that covers it.
"""

import http.client
import io
import json
import re
import time

import pytest
import tensorflow as tf

from common.errors import StorageError
from common.storage_errors import describe
from tests.gcs_server.object_names import NamedObjects, named_objects, unsafe_name

API, XML = "www.googleapis.com", "storage.googleapis.com"


def test_request_names_are_read_from_every_url_form_the_clients_use():
    assert named_objects("GET", "/storage/v1/b/bk/o/run%2Fexport%2F20%2Fsaved_model.pb?alt=json", API) == \
        NamedObjects("bk", ("run/export/20/saved_model.pb",))
    assert named_objects("GET", "/download/storage/v1/b/bk/o/a%2F%2Fb?alt=media", "127.0.0.1:4443").reads == ("a//b",)
    assert named_objects("POST", "/upload/storage/v1/b/bk/o?uploadType=resumable&name=a%2F%2Fb", API) == \
        NamedObjects("bk", creates=("a//b",))
    multipart = (b'--==x==\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{"name": "run//lock"}\r\n'
                 b'--==x==\r\ncontent-type: application/octet-stream\r\n\r\ndata\r\n--==x==--')
    assert named_objects("POST", "/upload/storage/v1/b/bk/o?uploadType=multipart", API, multipart,
                         'multipart/related; boundary="==x=="').creates == ("run//lock",)
    assert named_objects("POST", "/upload/storage/v1/b/bk/o?uploadType=resumable", API, b'{"name": "/x"}',
                         "application/json").creates == ("/x",)
    assert named_objects("POST", "/storage/v1/b/bk/o/a%2Fb/rewriteTo/b/bk/o/a%2F%2Fc", API) == \
        NamedObjects("bk", ("a/b",), ("a//c",))
    assert named_objects("POST", "/storage/v1/b/bk/o/c/compose", API, b'{"sourceObjects": [{"name": "a"}]}') == \
        NamedObjects("bk", ("a",), ("c",))
    assert named_objects("GET", "/bk/run%2Fvariables%2F%2Fv", XML) == NamedObjects("bk", ("run/variables//v",))
    assert named_objects("GET", "/bk/run/variables//v", XML) == NamedObjects("bk", ("run/variables//v",))
    listing = named_objects("GET", "/storage/v1/b/bk/o?prefix=run%2Fvariables%2F%2F&delimiter=%2F", API)
    assert listing == NamedObjects("bk")  # A listing's prefix is no object name: '//' prefixes may be listed.
    assert unsafe_name("a//b") and unsafe_name("/a") and not unsafe_name("a/b/") and not unsafe_name("a/b")


@pytest.mark.parametrize("backend", ["memory", "filesystem"])
def test_names_gcs_would_keep_apart_are_refused_or_not_found(backend, request):
    gcs = request.getfixturevalue("gcs" if backend == "memory" else "gcs_persistent")
    bucket = gcs.new_bucket()
    with tf.io.gfile.GFile(f"gs://{bucket}/a/b", "w") as handle:
        handle.write("content of a/b")
    for name in ("a//b", "/b"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="400 .*test proxy: refusing to create"):
            with tf.io.gfile.GFile(f"gs://{bucket}/{name}", "w") as handle:
                handle.write("x")
    with pytest.raises(Exception, match="400") as raised:
        gcs.client().bucket(bucket).blob("a//c").upload_from_string(b"x")
    assert "refusing to create 'a//c'" in str(raised.value)
    with pytest.raises(tf.errors.InvalidArgumentError, match="400"):
        tf.io.gfile.copy(f"gs://{bucket}/a/b", f"gs://{bucket}/a//c")
    assert not tf.io.gfile.exists(f"gs://{bucket}/a//b")
    with pytest.raises(tf.errors.NotFoundError):
        tf.io.gfile.GFile(f"gs://{bucket}/a//b").read()
    if backend == "filesystem":  # Negative control: past the proxy, that backend answers for 'a/b'.
        server = http.client.HTTPConnection("127.0.0.1", gcs.server_port, timeout=10)
        server.request("GET", f"/storage/v1/b/{bucket}/o/a%2F%2Fb?alt=media")
        assert server.getresponse().read() == b"content of a/b"
    assert gcs.object_names(bucket) == ["a/b"]


def test_generation_preconditions_answer_412(gcs, gcs_bucket):
    """gcs/run_lock.py's GcsLock relies on them: create-if-absent, heartbeat and release of its generation."""
    from google.api_core.exceptions import PreconditionFailed

    blob = gcs.client().bucket(gcs_bucket).blob("run/run.lock")
    blob.upload_from_string(b"first", if_generation_match=0)
    generation = blob.generation
    with pytest.raises(PreconditionFailed):
        blob.upload_from_string(b"second", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        blob.upload_from_string(b"second", if_generation_match=generation + 1)
    with pytest.raises(PreconditionFailed):
        blob.download_as_bytes(if_generation_match=generation + 1)
    with pytest.raises(PreconditionFailed):
        blob.delete(if_generation_match=generation + 1)
    blob.upload_from_string(b"second", if_generation_match=generation)  # The holder's own generation: accepted.
    assert blob.generation != generation and blob.download_as_bytes() == b"second"
    blob.delete(if_generation_match=blob.generation)
    assert gcs.object_names(gcs_bucket) == []


@pytest.mark.parametrize("status, cause", [(503, "storage unavailable (503)"), (429, "rate limited (429)")])
def test_tensorflow_retries_a_busy_server_and_names_the_cause_when_retries_run_out(status, cause, gcs, gcs_bucket):
    path = f"gs://{gcs_bucket}/run/metrics.json"
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write("{}")
    # The suite's GCS_RETRY_CONFIG_MAX_RETRIES=2 (tests/gcs_server/emulator.py): two failures are retried away.
    rule = gcs.inject_failures(f"{gcs_bucket}/o/run/metrics.json", status, 2, method="GET")
    assert tf.io.gfile.GFile(path).read() == "{}"
    assert len(gcs.failures_served(rule)) == 2
    rule = gcs.inject_failures(f"{gcs_bucket}/o/run/metrics.json", status, 3, method="GET")
    with pytest.raises(tf.errors.OpError) as raised:
        tf.io.gfile.GFile(path).read()
    assert len(gcs.failures_served(rule)) == 3 and describe(raised.value).startswith(cause + ": ")


@pytest.mark.parametrize("status, cause", [(429, "rate limited (429)"), (401, "credentials rejected (401)")])
def test_a_checkpoint_save_the_server_keeps_refusing_names_the_cause(status, cause, gcs, gcs_bucket, small_config):
    """The error a user reads after TensorFlow's retries (429) or at once (401, an expired token) says why."""
    from tpu_utils.strategy import make_strategy
    from training.run_directory.checkpoints import CheckpointStore
    from training.trainer import Trainer

    trainer = Trainer(small_config(), make_strategy("default"))
    directory = f"gs://{gcs_bucket}/run/checkpoints"
    store = CheckpointStore(trainer.checkpoint, read_dir=directory, write_dir=directory, keep=2)
    rule = gcs.inject_failures(rf"^(POST|PUT) .*{gcs_bucket}.*run/checkpoints/", status, 1000)
    expected = rf"Saving the checkpoint of step 0 to {directory} failed \({re.escape(cause)}"
    with pytest.raises(StorageError, match=expected):
        store.save(0)
    assert gcs.failures_served(rule)


def test_google_cloud_storage_retries_the_lock_upload(gcs, gcs_bucket):
    """The lock's create-if-absent (if_generation_match=0) is retried on 503 by google-cloud-storage's defaults."""
    from gcs.run_lock import GcsLock
    from training.run_directory.lock import LOCK_NAME

    rule = gcs.inject_failures(f"POST /upload/storage/v1/b/{gcs_bucket}/.* run/{LOCK_NAME}$", 503, 2)
    lock = GcsLock(f"gs://{gcs_bucket}/run")
    started = time.monotonic()
    lock.acquire()
    try:
        assert len(gcs.failures_served(rule)) == 2 and time.monotonic() - started < 60
        assert json.loads(gcs.client().bucket(gcs_bucket).blob(f"run/{LOCK_NAME}").download_as_bytes())["pid"]
    finally:
        lock.release()


def test_uploads_past_the_single_request_size_resume_and_read_back_exactly(gcs, gcs_bucket):
    """google-cloud-storage sends objects over 8 MiB in chunks (308 answers between them); TensorFlow uploads in a
    resumable session and, after a failed PUT, asks where to resume. Both through the proxy, bytes intact."""
    import numpy as np

    data = np.random.default_rng(0).integers(0, 256, 9 * 1024 * 1024 + 12345, dtype=np.uint8).tobytes()
    blob = gcs.client().bucket(gcs_bucket).blob("big/chunked.bin", chunk_size=1024 * 1024)
    blob.upload_from_file(io.BytesIO(data))
    assert blob.download_as_bytes() == data

    # TF's first data PUT fails once: it asks the session what arrived (nothing) and sends it all again.
    rule = gcs.inject_failures(rf"^PUT /upload/storage/v1/b/{gcs_bucket}/.*upload_id=", 503, 1)
    path = f"gs://{gcs_bucket}/big/tensorflow.bin"
    with tf.io.gfile.GFile(path, "wb") as handle:
        handle.write(data)
    assert len(gcs.failures_served(rule)) == 1
    with tf.io.gfile.GFile(path, "rb") as handle:
        assert handle.read() == data
        handle.seek(len(data) - 1000)  # A ranged read, as a checkpoint restore makes.
        assert handle.read() == data[-1000:]
