"""`train.py --preflight`: TPU configs checked on CPU for their replica count (one replica's share), exit 0 or 5.

Every shipped TPU config must pass, with its gs:// paths pointed at a test bucket: TFDS's mock data stands in for the
download-only datasets (MNIST, CIFAR-10); the ImageNet configs read a fake ImageNet staged into the bucket with
`python -m stage` (TFDS's real imagenet2012 builder on tiny tar files: tests/fake_imagenet.py). Deliberately
broken configs must each fail with a message that names the problem: a dynamic-shape input, a string op in the
model, a global batch that does not divide by the replica count, a local DATA_DIR for a pod slice.
"""

import glob
import os

import keras
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from data import device_split, pipeline
from models import registry as model_registry
from tests.helpers import REPO_ROOT, run_module, run_train_py, shipped_config
from training import preflight

TPU_CONFIGS = sorted(path for path in glob.glob(os.path.join(REPO_ROOT, "configs", "tpu", "*.gin"))
                     if not path.endswith("tpu_base.gin"))


def test_every_tpu_config_declares_its_replicas_and_bfloat16():
    assert len(TPU_CONFIGS) >= 4
    for path in TPU_CONFIGS:
        text = open(path).read()
        assert "experiment.target_replicas" in text and "configs/tpu/tpu_base.gin" in text, path
        assert "# Batch:" in text, f"{path}: the header must state per-replica batch and learning-rate scaling"


@pytest.fixture(scope="module")
def imagenet_bucket(gcs, tmp_path_factory) -> str:
    """A bucket with the fake ImageNet staged into gs://BUCKET/tensorflow_datasets by stage."""
    from tests.fake_imagenet import write_manual_dir

    bucket = gcs.new_bucket()
    manual = write_manual_dir(str(tmp_path_factory.mktemp("imagenet_tars")))
    staged = run_module("stage", "--dataset=imagenet2012", f"--data_dir=gs://{bucket}/tensorflow_datasets",
                        f"--manual_dir={manual}")
    assert staged.returncode == 0, staged.stderr[-3000:]
    return bucket


def _replicas_and_batch(path: str) -> tuple[int, int]:
    """The config's experiment.target_replicas and GLOBAL_BATCH_SIZE, read as train.py reads the config."""
    import gin

    config = shipped_config(path)
    gin.clear_config()  # The command under test parses the config itself.
    return config.target_replicas, config.global_batch_size


@pytest.mark.slow
@pytest.mark.parametrize("path", TPU_CONFIGS, ids=os.path.basename)
def test_every_shipped_tpu_config_passes_the_preflight(path, request):
    uses_imagenet = "configs/datasets/imagenet2012.gin" in open(path).read()
    # On the loopback GCS server: the bucket check runs for real.
    bucket = f"gs://{request.getfixturevalue('imagenet_bucket' if uses_imagenet else 'gcs_bucket')}"
    args = [f"--gin_file={path}", "--preflight", f"--gin_param=DATA_DIR='{bucket}/tensorflow_datasets'",
            f"--model_dir={bucket}/run"]
    # In this process at every replica count, 32 included: the preflight builds one replica's share.
    replicas, global_batch = _replicas_and_batch(path)
    if uses_imagenet:
        result = run_train_py(*args)
    else:
        # One global batch of mock examples per split: the split must hold a batch (a check of its own, below); TFDS
        # generates mock examples in Python, and more of them only cost time here.
        with tfds.testing.mock_data(num_examples=global_batch):
            result = run_train_py(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "preflight passed." in result.stdout
    assert f"preflight for {replicas} replica(s)," in result.stdout, result.stdout
    # TFDS's mock data has no split sizes: each split is counted once (data/builders.py), not by every reader.
    output = result.stdout + result.stderr
    assert output.count("counting train.") <= 1 and output.count("counting test.") <= 1, output
    for check in ("train step compiles with XLA", "static per-replica input shapes", "gs:// buckets exist"):
        assert f"ok   {check}" in result.stdout, result.stdout
    # 'auto' keeps MNIST and CIFAR-10 in the TPU's memory; ImageNet is read by shard file on the host.
    split = ("ok   train split (read by tf.data on the host: the train split is read by shard file" if uses_imagenet
             else "ok   train split on the device, its draw compiles with XLA (")
    assert split in result.stdout, result.stdout


def test_the_one_chip_cifar10_config_keeps_its_split_on_the_tpu_when_always(gcs_bucket, monkeypatch):
    """experiment.train_data_on_device='always' passes, and the line says what each replica keeps: TFDS's mock
    CIFAR-10 of 4,096 examples, 32 x 32 x 3 bytes each and an int64 label, 12.0 MiB. The split is decoded once (the
    host's pipeline, not used then, decoded it a second time)."""
    from data import pipeline

    decoded = []
    decode = pipeline.decoded_train_split
    monkeypatch.setattr(pipeline, "decoded_train_split", lambda *args: decoded.append(args) or decode(*args))
    with tfds.testing.mock_data(num_examples=4096):
        result = run_train_py("--gin_file=configs/tpu/cifar10_resnet_1_chip.gin", "--preflight",
                              "--gin_param=experiment.train_data_on_device='always'",
                              f"--gin_param=DATA_DIR='gs://{gcs_bucket}/tensorflow_datasets'",
                              f"--model_dir=gs://{gcs_bucket}/run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ok   train split on the device, its draw compiles with XLA (12.0 MiB per replica)" in result.stdout
    assert len(decoded) == 1, decoded


def _config(small_config, **overrides):
    return small_config(**{"target_replicas": 4, "global_batch_size": 64, **overrides})


def _problems(checks) -> dict:
    return {check.name: check.problem for check in checks if check.problem}


def test_a_valid_config_passes(small_config, tmp_path):
    checks = preflight.run_preflight(_config(small_config), str(tmp_path))
    assert _problems(checks) == {} and len(checks) == 7
    assert "4 replica(s)" in preflight.report(checks, _config(small_config))


def test_a_global_batch_that_does_not_divide_fails(small_config, tmp_path):
    problems = _problems(preflight.run_preflight(_config(small_config, global_batch_size=50), str(tmp_path)))
    assert "GLOBAL_BATCH_SIZE=50 does not divide by the 4 replicas" in problems["batch divides by the replicas"]


def test_a_local_data_dir_on_a_pod_slice_fails(small_config, gcs_bucket):
    config = _config(small_config, strategy="tpu", tpu="my-tpu-pod")
    problems = _problems(preflight.run_preflight(config, f"gs://{gcs_bucket}/run"))
    assert list(problems) == ["storage on gs://"]
    assert f"DATA_DIR={config.data_dir!r}" in problems["storage on gs://"]
    assert "model_dir=" not in problems["storage on gs://"].split("is not on gs://")[0]


def test_a_dynamic_shape_input_fails(small_config, tmp_path, monkeypatch):
    real = pipeline.make_train_input_fn

    def without_drop_remainder(*args, **kwargs):  # A user's pipeline that batches with drop_remainder=False.
        input_fn = real(*args, **kwargs)
        return lambda context: input_fn(context).unbatch().batch(16)

    monkeypatch.setattr(pipeline, "make_train_input_fn", without_drop_remainder)
    # The host's pipeline feeds the step ('never'; with the split on the device, its draw does, and the check reads
    # that one's shapes).
    config = _config(small_config, train_data_on_device="never")
    problems = _problems(preflight.run_preflight(config, str(tmp_path)))
    assert "not fully defined: train TensorSpec(shape=(None, 8, 8, 1)" in problems["static per-replica input shapes"]


def _model_with_a_string_op(input_shape, num_classes, **options):
    inputs = keras.Input(shape=input_shape)
    # Round-trips the pixels through strings: runs on a CPU, has no XLA kernel, so it cannot run on a TPU.
    x = keras.layers.Lambda(lambda t: tf.strings.to_number(tf.strings.as_string(t)))(inputs)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, dtype="float32")(x))


def test_a_string_op_in_the_model_fails(small_config, tmp_path, monkeypatch):
    monkeypatch.setitem(model_registry.MODELS, "with_strings", _model_with_a_string_op)
    problems = _problems(preflight.run_preflight(_config(small_config, model="with_strings"), str(tmp_path)))
    assert list(problems) == ["train step compiles with XLA"]
    assert "AsString" in problems["train step compiles with XLA"]


def test_a_global_batch_larger_than_the_split_fails(small_config, tmp_path):
    """Checked at the global batch, though the preflight builds one replica's share."""
    problems = _problems(preflight.run_preflight(_config(small_config, global_batch_size=2048), str(tmp_path)))
    assert "GLOBAL_BATCH_SIZE=2048 is larger than the 1437 examples" in problems["input pipelines and model build"]


def test_a_tpu_config_keeps_the_split_on_the_device_unless_it_does_not_fit(small_config, tmp_path, monkeypatch):
    checks = preflight.run_preflight(_config(small_config, strategy="tpu"), str(tmp_path))
    assert _problems(checks) == {}
    assert "ok   train split on the device, its draw compiles with XLA (" in preflight.report(checks, _config(
        small_config))
    monkeypatch.setattr(device_split, "TPU_REPLICA_HBM_BYTES", 1 << 20)  # A model and split over half of 1 MiB.
    report = preflight.report(preflight.run_preflight(_config(small_config, strategy="tpu"), str(tmp_path)),
                              _config(small_config))
    assert "ok   train split (read by tf.data on the host: the decoded train split (" in report, report


def test_negative_control_a_draw_without_an_xla_kernel_fails(small_config, tmp_path, monkeypatch):
    """The permutation this template used before common/keyed_random.epoch_permutation: index_shuffle, which XLA
    cannot compile."""
    def index_shuffle(indices, *, seed, epoch, size):
        first_epoch = tf.reshape(epoch, [-1])[0]  # Its seed is one pair: the batch's first epoch will do here.
        return tf.random.experimental.index_shuffle(indices, seed=tf.stack([tf.constant(seed, tf.int64), first_epoch]),
                                                    max_index=size - 1)

    monkeypatch.setattr(pipeline, "epoch_permutation", index_shuffle)
    problems = _problems(preflight.run_preflight(_config(small_config, strategy="tpu"), str(tmp_path)))
    assert list(problems) == ["train split on the device, its draw compiles with XLA"], problems
    assert "RandomIndexShuffle" in problems["train split on the device, its draw compiles with XLA"]


def test_cli_exit_codes(tmp_path, data_dir):
    failed = run_train_py("--preflight", "--gin_param=experiment.target_replicas=8", "--gin_param=GLOBAL_BATCH_SIZE=60",
                          f"--model_dir={tmp_path}")
    assert failed.returncode == 5, failed.stdout + failed.stderr
    assert "FAIL batch divides by the replicas: GLOBAL_BATCH_SIZE=60" in failed.stdout
    assert "preflight failed: 1 problem(s)." in failed.stdout
    assert not os.listdir(tmp_path)  # A preflight writes nothing.
