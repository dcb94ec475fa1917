"""Training data order is a pure function of (SEED, step), whatever the replica or host count; a dataset that cannot
be prepared is a ConfigError naming the fix."""

import socket

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from common import errors
from common.errors import ConfigError
from data import builders, downloads, pipeline
from data.registry import get_dataset_spec

GLOBAL_BATCH = 24


def _batches(data_dir, *, seed=0, start_step=0, pipelines=1, steps=5):
    """First `steps` global batches, as lists of per-pipeline label/image arrays concatenated in pipeline order."""
    spec = get_dataset_spec("digits")
    builder = builders.load_builder(spec, data_dir)
    input_fn = pipeline.make_train_input_fn(spec, builder, global_batch_size=GLOBAL_BATCH, seed=seed,
                                            start_step=start_step)
    per_pipeline = []
    for pipeline_id in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=pipelines)
        per_pipeline.append([(images.numpy(), labels.numpy()) for images, labels, _ in input_fn(context).take(steps)])
    return per_pipeline


def _as_sets(images):
    return sorted(image.tobytes() for image in images)


def test_resumed_pipeline_continues_exactly(data_dir):
    full = _batches(data_dir, steps=80)[0]  # 80 x 24 > 1,437: crosses an epoch boundary.
    resumed = _batches(data_dir, start_step=70, steps=10)[0]
    for (images_a, labels_a), (images_b, labels_b) in zip(full[70:], resumed, strict=True):
        np.testing.assert_array_equal(images_a, images_b)
        np.testing.assert_array_equal(labels_a, labels_b)


def test_each_epoch_is_a_permutation_and_epochs_differ(data_dir):
    batches = _batches(data_dir, steps=120)[0]
    labels = np.concatenate([labels for _, labels in batches])
    epoch_0, epoch_1 = labels[:1437], labels[1437:2874]
    assert np.bincount(epoch_0).tolist() == np.bincount(epoch_1).tolist()  # Same examples ...
    assert not np.array_equal(epoch_0, epoch_1)  # ... in another order.


def test_global_batch_is_the_same_examples_for_any_pipeline_count(data_dir):
    one = _batches(data_dir, pipelines=1)[0]
    three = _batches(data_dir, pipelines=3)
    for step in range(5):
        split = np.concatenate([three[pipeline_id][step][0] for pipeline_id in range(3)])
        assert split.shape[0] == GLOBAL_BATCH
        assert _as_sets(split) == _as_sets(one[step][0])


def test_seed_changes_the_order(data_dir):
    a = _batches(data_dir, seed=0)[0][0][1]
    b = _batches(data_dir, seed=1)[0][0][1]
    assert not np.array_equal(a, b)


def test_an_unreachable_download_says_to_stage_it_elsewhere_not_to_change_data_dir(tmp_path, monkeypatch):
    """DATASET='mnist' on a machine that cannot reach the internet. Simulated, so that the test neither leaves the
    machine nor waits on a DNS or connect timeout: the MNIST builder's source URL points at a loopback port that
    refuses connections (a socket bound, never listening), and TFDS's 10 retries with back-off are cut to none. The
    real TFDS download code runs and raises what it raises offline: requests' ConnectionError, an OSError, which
    used to be reported as an unusable DATA_DIR."""
    from tensorflow_datasets.core.download import downloader

    monkeypatch.setattr(downloads, "offline_reason", lambda: None)  # As on a machine whose name lookups work.
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))
        monkeypatch.setattr(tfds.builder_cls("mnist"), "URL", f"http://127.0.0.1:{refusing.getsockname()[1]}/")
        monkeypatch.setattr(downloader, "MAX_RETRIES", 0)
        with pytest.raises(ConfigError) as raised:
            builders.load_builder(get_dataset_spec("mnist"), str(tmp_path / "tfds"))
    message = str(raised.value)
    assert "Downloading 'mnist' failed (ConnectionError: " in message and "127.0.0.1" in message, message
    assert ("this machine cannot reach its source. Stage it where there is internet (python -m stage "
            "--dataset=mnist --data_dir=DIR), copy DIR here or to gs://, and pass DATA_DIR=DIR.") in message, message
    assert "cannot be used" not in message


def _offline(monkeypatch) -> list[str]:
    """No name lookup works but loopback's, as on an offline machine (simulated: the test does not depend on this
    machine's network); returns the list the other looked-up host names are appended to. (Loopback is answered as
    usual, uncounted: another test's TFDS download threads, which outlive it, may still try a loopback URL.)"""
    lookups, lookup = [], socket.getaddrinfo

    def no_lookup(host, *args, **kwargs):
        if host in ("127.0.0.1", "localhost", "::1"):
            return lookup(host, *args, **kwargs)
        lookups.append(host)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    for name in downloads.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return lookups


def test_offline_a_dataset_that_downloads_stops_at_once_instead_of_retrying_for_minutes(tmp_path, monkeypatch):
    """DATASET='mnist' offline: a ConfigError naming the failed lookup and the stage command after one attempt per
    file, where TFDS alone makes eleven with back-off (~3.5 minutes); TFDS's real download code runs."""
    from tensorflow_datasets.core.download import downloader

    lookups = _offline(monkeypatch)
    with pytest.raises(ConfigError) as raised:
        builders.load_builder(get_dataset_spec("mnist"), str(tmp_path / "tfds"))
    message = str(raised.value)
    assert message == (
        "Downloading 'mnist' failed (ConnectionError: storage.googleapis.com cannot be looked up ([Errno -2] Name or "
        "service not known)): this machine cannot reach its source. Stage it where there is internet (python -m "
        "stage --dataset=mnist --data_dir=DIR), copy DIR here or to gs://, and pass DATA_DIR=DIR."), message
    assert len(lookups) <= 5, lookups  # The probe, then one attempt for each of MNIST's 4 files at most.
    assert downloader.MAX_RETRIES == 10  # TFDS's own setting is back.
    assert builders.load_builder(get_dataset_spec("breast_cancer"), str(tmp_path / "bundled")).is_prepared()


def test_negative_control_without_the_probe_tfds_retries_each_file_eleven_times(tmp_path, monkeypatch):
    import urllib3

    lookups = _offline(monkeypatch)
    monkeypatch.setattr(downloads, "offline_reason", lambda: None)
    monkeypatch.setattr(urllib3.util.retry.Retry, "sleep", lambda self, response=None: None)  # No back-off waits.
    with pytest.raises(ConfigError, match="cannot reach its source"):
        builders.load_builder(get_dataset_spec("mnist"), str(tmp_path / "tfds"))
    assert len(lookups) >= 11, lookups


def test_the_offline_probe_leaves_the_download_to_tfds_when_a_lookup_works_or_a_proxy_is_set(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: [])
    assert downloads.offline_reason(environ={}) is None

    def no_lookup(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    assert "cannot be looked up" in downloads.offline_reason(environ={})
    assert downloads.offline_reason(environ={"HTTPS_PROXY": "http://proxy:3128"}) is None  # The proxy looks up.


def test_long_library_errors_are_cut_at_a_word():
    assert errors.shorten("Name or service not known " * 20, 40) == "Name or service not known Name or ..."
    assert errors.shorten("short\n text", 40) == "short text"


def test_a_builder_assertion_without_a_manual_dir_is_a_config_error_naming_the_stage_command(tmp_path, monkeypatch):
    """TFDS builders report missing or incomplete source files with an AssertionError. load_builder passes no
    download_config, which the message used to read: an AttributeError hid the builder's own words."""
    spec = get_dataset_spec("digits")
    builder_class = type(builders.find_builder(spec.tfds_name, str(tmp_path), module=spec.module))

    def incomplete_source(self, dl_manager):
        raise AssertionError("digits.csv not found")

    monkeypatch.setattr(builder_class, "_split_generators", incomplete_source)
    with pytest.raises(ConfigError) as raised:
        builders.load_builder(spec, str(tmp_path))
    assert (f"Cannot prepare 'sklearn_digits' in {tmp_path}: digits.csv not found. " in str(raised.value)
            and f"python -m stage --dataset=digits --manual_dir=DIR --data_dir={tmp_path}" in str(raised.value))


def test_a_dataset_prepared_meanwhile_by_another_worker_is_used(tmp_path, monkeypatch):
    """Two workers of a fresh multi-worker job both prepare the bundled dataset; the slower one's final rename finds
    the folder there (FileExistsError: it stopped worker 1 of a new user's first launch_local run). Simulated in one
    process, deterministically: the 'other worker' prepares it for real, then this one's rename fails as TFDS's does.
    Control: the same error with nothing prepared is still an error."""
    spec = get_dataset_spec("digits")
    real_prepare = builders.prepare

    def lose_the_race(builder, download_config=None, **_):
        other = builders.find_builder(spec.tfds_name, str(tmp_path / "raced"), module=spec.module)
        real_prepare(other)
        raise FileExistsError(f"Cannot rename ... Destination {other.data_dir} already exists.")

    monkeypatch.setattr(builders, "prepare", lose_the_race)
    builder = builders.load_builder(spec, str(tmp_path / "raced"))
    assert builder.is_prepared() and builder.info.splits["train"].num_examples == 1437

    def fail(builder, download_config=None, **_):
        raise FileExistsError("Cannot rename: destination exists")

    monkeypatch.setattr(builders, "prepare", fail)
    with pytest.raises(ConfigError, match="cannot be used for 'sklearn_digits'"):
        builders.load_builder(spec, str(tmp_path / "empty"))
