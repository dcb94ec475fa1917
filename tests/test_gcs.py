"""Runs on gs://, against a real GCS JSON-API server on loopback (tests/gcs_server/), through TensorFlow's own
gs:// client, TFDS and google-cloud-storage: staging, training, resuming, exporting, the bucket checks, and a
checkpoint save while the server is gone. Nothing is mocked but Google Cloud itself.
"""

import time

import numpy as np
import pytest
import tensorflow as tf

from common.errors import ConfigError, StorageError
from gcs.bucket_checks import check_gcs_paths, location_serves_region
from tests.helpers import run_module, run_train_py

TINY = ["--gin_param=TRAIN_STEPS=20", "--gin_param=STEPS_PER_LOOP=10", "--gin_param=EVAL_EVERY=10",
        "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=cosine.warmup_steps=5"]


def _generations(gcs, bucket: str, prefix: str) -> dict:
    return {blob.name: blob.generation for blob in gcs.client().list_blobs(bucket, prefix=prefix)}


@pytest.mark.slow
def test_stage_train_resume_and_export_all_on_gcs(gcs, gcs_bucket):
    data_dir, model_dir = f"gs://{gcs_bucket}/tensorflow_datasets", f"gs://{gcs_bucket}/runs/digits"
    staged = run_module("stage", "--dataset=digits", f"--data_dir={data_dir}")
    assert staged.returncode == 0 and "digits: built into" in staged.stdout, staged.stdout + staged.stderr
    before = _generations(gcs, gcs_bucket, "tensorflow_datasets/")
    assert any(name.endswith("dataset_info.json") for name in before) and any("tfrecord" in name for name in before)

    again = run_module("stage", "--dataset=digits", f"--data_dir={data_dir}")
    assert again.returncode == 0 and "already staged" in again.stdout and "nothing to do" in again.stdout
    assert _generations(gcs, gcs_bucket, "tensorflow_datasets/") == before  # Not one object rewritten.

    trained = run_train_py(*TINY, f"--gin_param=DATA_DIR='{data_dir}'", f"--model_dir={model_dir}")
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    names = gcs.object_names(gcs_bucket, "runs/digits/")
    for expected in ("checkpoints/checkpoint", "checkpoints/ckpt-20.index", "operative_config.gin", "command.txt",
                     "metrics.json", "run_identity.json", "export/20/saved_model.pb"):
        assert f"runs/digits/{expected}" in names, names
    for board in ("train", "eval"):
        assert any(name.startswith(f"runs/digits/{board}/events.out.tfevents") for name in names), names

    resumed = run_train_py(*TINY, "--gin_param=TRAIN_STEPS=30", f"--gin_param=DATA_DIR='{data_dir}'",
                           f"--model_dir={model_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resumed from {model_dir}/checkpoints/ckpt-20 at step 20" in resumed.stdout
    assert "'step': 30" in resumed.stdout

    serving = tf.saved_model.load(f"{model_dir}/export/30").signatures["serving_default"]
    images = tf.constant(np.random.default_rng(0).integers(0, 17, (3, 8, 8, 1)), tf.uint8)
    probabilities = serving(images=images)["probabilities"].numpy()
    assert probabilities.shape == (3, 10) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)


def test_a_missing_bucket_is_a_config_error_naming_it(gcs):
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"model_dir='gs://no-such-bucket-4711/run': bucket gs://no-such-bucket-4711 "
                                          r"does not exist .* gcloud storage buckets create gs://no-such-bucket-4711"):
        check_gcs_paths({"DATA_DIR": None, "model_dir": "gs://no-such-bucket-4711/run"})
    assert time.monotonic() - started < 10


def test_an_unwritable_bucket_stops_train_py_before_training(gcs, gcs_bucket, tmp_path):
    gcs.deny_writes(gcs_bucket)
    result = run_train_py(*TINY, f"--model_dir=gs://{gcs_bucket}/run", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"cannot write to gs://{gcs_bucket} (403)" in result.stderr and "roles/storage.objectAdmin" in result.stderr
    assert "step " not in result.stdout and "Strategy" not in result.stdout  # Nothing was built, nothing trained.
    assert gcs.object_names(gcs_bucket) == []


def test_a_bucket_in_another_region_than_the_tpu_is_refused(gcs, gcs_bucket):
    location = gcs.client().get_bucket(gcs_bucket).location  # fake-gcs-server puts every bucket in US-CENTRAL1.
    assert location == "US-CENTRAL1"
    check_gcs_paths({"model_dir": f"gs://{gcs_bucket}/run"}, tpu_zone="us-central1-b")
    with pytest.raises(ConfigError, match="is in US-CENTRAL1, the TPU in europe-west4-a .* Use a bucket in "
                                          "europe-west4"):
        check_gcs_paths({"model_dir": f"gs://{gcs_bucket}/run"}, tpu_zone="europe-west4-a")


def test_the_configs_placeholder_bucket_is_named_before_credentials_or_network_are_needed(monkeypatch):
    """configs/tpu/tpu_base.gin's DATA_DIR='gs://YOUR_BUCKET/...' used to end in "need Google Cloud credentials",
    which names neither the path nor the placeholder."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    with pytest.raises(ConfigError) as raised:
        check_gcs_paths({"DATA_DIR": "gs://YOUR_BUCKET/tensorflow_datasets", "model_dir": "runs/x"},
                        client=object())  # Never used: the name is refused first.
    assert str(raised.value).startswith(
        "DATA_DIR='gs://YOUR_BUCKET/tensorflow_datasets': 'YOUR_BUCKET' (the configs' placeholder) is not a Cloud "
        "Storage bucket name"), raised.value
    assert "--gin_param=\"DATA_DIR='gs://my-bucket/tensorflow_datasets'\"" in str(raised.value)
    with pytest.raises(ConfigError, match=r"model_dir='gs://Runs_Here/x': 'Runs_Here' is not a .* e\.g\. "
                                          r"--model_dir=gs://my-bucket/x"):
        check_gcs_paths({"model_dir": "gs://Runs_Here/x"}, client=object())


def test_a_gs_path_with_an_empty_folder_name_is_refused_naming_the_path_meant(gcs, gcs_bucket):
    """'gs://b//run' (e.g. an unset $PREFIX) is the object prefix '/run/' on GCS, not 'run/': refused at start, exit 2,
    before anything is written (the old code trained and wrote there)."""
    result = run_train_py(*TINY, f"--model_dir=gs://{gcs_bucket}//run", timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert (f"error: model_dir='gs://{gcs_bucket}//run' has an empty folder name ('//')" in result.stderr and
            f"Write single slashes: --model_dir=gs://{gcs_bucket}/run." in result.stderr), result.stderr
    assert gcs.object_names(gcs_bucket) == []
    with pytest.raises(ConfigError, match=r"DATA_DIR='gs://my-data/a//tfds' .* --gin_param=\"DATA_DIR='gs://my-data/"
                                          r"a/tfds'\""):
        check_gcs_paths({"DATA_DIR": "gs://my-data/a//tfds", "model_dir": "runs/x"}, client=object())
    check_gcs_paths({"model_dir": f"gs://{gcs_bucket}/run/"})  # Negative control: one trailing slash is fine.


def test_without_credentials_the_error_names_the_gs_paths_that_need_them(monkeypatch):
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    from gcs.bucket_checks import default_client

    def no_credentials(*args, **kwargs):
        raise DefaultCredentialsError("none")

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setattr(google.auth, "default", no_credentials)
    with pytest.raises(ConfigError, match=r"^DATA_DIR='gs://my-data/tfds', model_dir='gs://my-runs/a' need Google "
                                          r"Cloud credentials and none were found: run `gcloud auth"):
        check_gcs_paths({"DATA_DIR": "gs://my-data/tfds", "model_dir": "gs://my-runs/a"})
    with pytest.raises(ConfigError, match=r"^gs:// paths need Google Cloud credentials"):
        default_client()


def test_bucket_locations_and_tpu_regions():
    assert location_serves_region("US-CENTRAL1", "us-central1")
    assert location_serves_region("US", "us-east1") and not location_serves_region("EU", "us-east1")
    assert location_serves_region("us-central1", "europe-west4") is False
    assert location_serves_region("NAM4", "us-central1") is None  # A dual-region: not judged.


def test_a_checkpoint_save_while_the_server_is_gone_keeps_the_previous_one(gcs_persistent, small_config,
                                                                             monkeypatch):
    from tpu_utils.strategy import make_strategy
    from training.controller import Controller
    from training.run_directory.layout import RunDirectory
    from training.run_directory.record import RunRecord
    from training.run_directory.storage_guard import StorageGuard
    from training.trainer import Trainer

    gcs = gcs_persistent  # Its objects are on disk: they come back with the server.
    model_dir = f"gs://{gcs.new_bucket()}/run"
    trainer = Trainer(small_config(train_steps=15, steps_per_loop=5, checkpoint_every=5), make_strategy("default"))
    # The save is retried (training waits) for experiment.storage_timeout_seconds, here 5 s; then a StorageError.
    directory = RunDirectory(model_dir, guard=StorageGuard(timeout_seconds=5))
    controller = Controller(trainer, RunRecord(trainer, directory))
    controller.record.restore()
    train, weights_at_5 = trainer.train, []

    def train_then_lose_the_server(iterator, num_steps):
        if trainer.step == 5:  # The checkpoint of step 5 is on the server: remember it, then the server goes away.
            weights_at_5.extend(weight.numpy() for weight in trainer.model.weights)
            gcs.stop_server()
        return train(iterator, num_steps)

    monkeypatch.setattr(trainer, "train", train_then_lose_the_server)
    started = time.monotonic()
    try:
        with pytest.raises(StorageError, match=rf"The storage has failed for \d+ s .*The previous checkpoint "
                                               rf"\({model_dir}/checkpoints/ckpt-5\) is intact"):
            controller.train_and_evaluate()
        assert time.monotonic() - started < 60  # Bounded retries, no hang.
    finally:
        gcs.restart_server()  # Same objects on disk: nothing written before the outage is lost.
    assert tf.train.latest_checkpoint(f"{model_dir}/checkpoints") == f"{model_dir}/checkpoints/ckpt-5"
    restored = Trainer(small_config(train_steps=15, steps_per_loop=5), make_strategy("default"))
    RunRecord(restored, RunDirectory(model_dir)).restore()
    assert restored.step == 5
    assert len(weights_at_5) == len(restored.model.weights)
    for weight, expected in zip(restored.model.weights, weights_at_5, strict=True):
        np.testing.assert_array_equal(weight.numpy(), expected)


def test_an_export_to_gcs_publishes_saved_model_pb_last_and_replaces_an_old_one(gcs, gcs_bucket, small_config,
                                                                               monkeypatch):
    """gs:// copies a folder object by object: saved_model.pb (what makes a folder a SavedModel for TF Serving and
    tf.saved_model.load) must be the last file written and the first one removed, so a kill mid-export never leaves
    a loadable SavedModel with missing or mixed variables. The second export replaces the first (export/best)."""
    from tpu_utils.strategy import make_strategy
    from training.run_directory import export
    from training.trainer import Trainer

    trainer = Trainer(small_config(), make_strategy("default"))
    target = f"gs://{gcs_bucket}/run/export/best"
    events = []
    copy, remove = tf.io.gfile.copy, tf.io.gfile.remove
    monkeypatch.setattr(tf.io.gfile, "copy", lambda source, destination, overwrite=False: (
        events.append(("copy", destination[len(target):])), copy(source, destination, overwrite))[1])
    monkeypatch.setattr(tf.io.gfile, "remove", lambda path: (events.append(("remove", path)), remove(path))[1])
    export.export_saved_model(trainer.model, trainer.task, target)
    copied = [name for kind, name in events if kind == "copy"]
    assert copied[-1] == "/saved_model.pb" and any(name.startswith("/variables/") for name in copied), copied

    events.clear()
    images = tf.constant(np.random.default_rng(0).integers(0, 17, (3, 8, 8, 1)), tf.uint8)
    first_logits = trainer.task.serve(trainer.model, {"images": images})["logits"].numpy()
    trainer.model.weights[0].assign(trainer.model.weights[0] + 1.0)
    export.export_saved_model(trainer.model, trainer.task, target)
    assert events[0] == ("remove", f"{target}/saved_model.pb"), events[:3]
    assert [name for kind, name in events if kind == "copy"][-1] == "/saved_model.pb"
    served = tf.saved_model.load(target).signatures["serving_default"](images=images)["logits"]
    np.testing.assert_allclose(served.numpy(), trainer.task.serve(trainer.model, {"images": images})["logits"].numpy(),
                               rtol=1e-5, atol=1e-4)  # The second model's weights ...
    assert np.max(np.abs(served.numpy() - first_logits)) > 1.0  # ... which the first model's would not match.


def test_own_data_staged_again_on_gcs_is_compared_with_its_recorded_source(gcs, gcs_bucket, tmp_path, capsys):
    """The source fingerprint is written to and read from gs:// (tf.io.gfile), with the source on gs:// too: the
    same source does nothing, another one exits 2, and neither rewrites an object."""
    from stage import cli as stage

    data_dir, rng = f"gs://{gcs_bucket}/tfds", np.random.default_rng(0)
    for name in ("first", "second"):
        local = tmp_path / f"{name}.npz"
        np.savez(local, x_train=rng.standard_normal((20, 3)), y_train=np.arange(20) % 2,
                 x_test=rng.standard_normal((6, 3)), y_test=np.arange(6) % 2)
        tf.io.gfile.copy(str(local), f"gs://{gcs_bucket}/sources/{name}.npz")
    arguments = ["--name=own_gcs", f"--data_dir={data_dir}"]
    assert stage.main([*arguments, f"--from_npz=gs://{gcs_bucket}/sources/first.npz"]) == 0
    before = _generations(gcs, gcs_bucket, "tfds/")
    assert "tfds/own_gcs/1.0.0/staged_source.json" in before, sorted(before)
    capsys.readouterr()
    assert stage.main([*arguments, f"--from_npz=gs://{gcs_bucket}/sources/first.npz"]) == 0
    assert "own_gcs: already staged from this source in" in capsys.readouterr().out
    assert stage.main([*arguments, f"--from_npz=gs://{gcs_bucket}/sources/second.npz"]) == 2
    error = capsys.readouterr().err
    assert (f"staged: --from_npz=gs://{gcs_bucket}/sources/first.npz; now: --from_npz=gs://{gcs_bucket}/sources/"
            "second.npz" in error and "--force" in error), error
    assert _generations(gcs, gcs_bucket, "tfds/") == before

    images = f"gs://{gcs_bucket}/images"
    for split, count in (("train", 2), ("test", 1)):
        for label in ("a", "b"):
            for index in range(count):
                tf.io.write_file(f"{images}/{split}/{label}/{index}.png",
                                 tf.io.encode_png(np.full((4, 4, 3), index * 40 + 10 * (label == "b"), np.uint8)))
    arguments = ["--name=own_gcs_images", f"--data_dir={data_dir}", f"--from_image_folder={images}"]
    assert stage.main(arguments) == 0 and stage.main(arguments) == 0
    assert "own_gcs_images: already staged from this source in" in capsys.readouterr().out
