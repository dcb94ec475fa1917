"""What a killed run leaves in model_dir is removed by the next one (training/run_directory/leftovers.py), exactly
that and nothing
else, on local folders and on gs:// with exact object names (tests/gcs_server/: as strict as GCS).

The end-to-end case: `python train.py --model_dir=gs://...` killed (SIGKILL) in the middle of copying its export
into place, then rerun: the rerun ends with a loadable export/<step>/ and not one temporary object. That run uses
TensorFlow's default GCS settings (stat cache, retries), as production does, not the suite's shortened ones.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from common.storage_paths import join
from tests.gcs_server.emulator import EARLY_ENVIRONMENT
from tests.helpers import REPO_ROOT
from training.run_directory.leftovers import remove_leftovers

LEFTOVERS = ["export/.20.tmp-0a1b2c3d/saved_model.pb", "export/.20.tmp-0a1b2c3d/variables/variables.index",
             "export/.best.tmp-99aa00ff/fingerprint.pb", "checkpoints/ckpt-30_temp/part-00000-of-00001.index",
             "checkpoints/checkpoint.tmp" + "e" * 32, "best/ckpt-20_temp/part-00000-of-00001.data-00000-of-00001",
             "best/checkpoint.tmp" + "0" * 32, "best/.best.json.tmp", ".metrics.json.tmp",
             ".write-probe-" + "f" * 32]
KEPT = ["export/20/saved_model.pb", "export/20/variables/variables.index", "export/best/saved_model.pb",
        "export/.20.tmp-notahexx/x", "export/20.tmp-0a1b2c3d/x", "checkpoints/checkpoint", "checkpoints/ckpt-30.index",
        "checkpoints/ckpt-30_temperature.txt", "checkpoints/.metrics.json.tmp", "best/best.json", "metrics.json",
        "metrics.tmp", "train/events.out.tfevents.1", "mine/.20.tmp-0a1b2c3d/x", "mine/checkpoint.tmp" + "e" * 32]


def _write(path: str) -> None:
    tf.io.gfile.makedirs(path.rsplit("/", 1)[0])
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write("x")


def _files(root: str) -> list[str]:
    from common.storage_paths import files_under, relative_to

    return [relative_to(path, root) for path in files_under(root)]


@pytest.mark.parametrize("where", ["local", "gs"])
def test_exactly_the_temporary_files_of_a_killed_run_are_removed(where, tmp_path, request):
    model_dir = str(tmp_path / "run") if where == "local" else f"gs://{request.getfixturevalue('gcs_bucket')}/run"
    for name in LEFTOVERS + KEPT:
        _write(join(model_dir, name))
    removed = remove_leftovers(model_dir)
    assert _files(model_dir) == sorted(KEPT)
    assert sorted(removed) == sorted({_top(model_dir, name) for name in LEFTOVERS})
    assert remove_leftovers(model_dir) == []  # Nothing left to remove; nothing else touched.
    assert _files(model_dir) == sorted(KEPT)


def _top(model_dir: str, name: str) -> str:
    """The path removed for leftover `name`: its temporary folder, or the file itself."""
    parts = name.split("/")
    for depth in range(1, len(parts)):
        if parts[depth - 1] in ("export", "checkpoints", "best") and depth < len(parts) - 1:
            return join(model_dir, *parts[:depth + 1])
    return join(model_dir, name)


def test_objects_with_a_double_slash_below_model_dir_are_removed_and_nothing_outside(gcs, gcs_bucket):
    """Old versions copied exports to 'export/20/variables//...' (kept apart from 'variables/' on GCS)."""
    model_dir = f"gs://{gcs_bucket}/run"
    stray = ["run/export/20/variables//variables.data-00000-of-00001", "run/export/.20.tmp-0a1b2c3d/variables//v",
             "run//x", "run/train//events"]
    outside = ["other//x", "run2//x", "runs/a//b"]
    for name in stray + outside:
        gcs.plant_object(gcs_bucket, name)
    _write(f"{model_dir}/export/20/variables/variables.data-00000-of-00001")
    removed = remove_leftovers(model_dir)
    objects = [name for name in gcs.object_names(gcs_bucket) if not name.endswith("/")]  # Not folder markers.
    assert objects == sorted(outside + ["run/export/20/variables/variables.data-00000-of-00001"])
    assert f"{model_dir}/export/.20.tmp-0a1b2c3d" in removed and f"gs://{gcs_bucket}/run//x" in removed


def test_only_a_chief_that_may_write_removes_them(small_config, tmp_path):
    from tpu_utils.strategy import make_strategy
    from training.run_directory.layout import RunDirectory
    from training.run_directory.record import RunRecord
    from training.trainer import Trainer

    model_dir = str(tmp_path / "run")
    leftover = join(model_dir, "export", ".20.tmp-0a1b2c3d", "saved_model.pb")
    _write(leftover)
    trainer = Trainer(small_config(), make_strategy("default"))
    RunRecord(trainer, RunDirectory(model_dir, is_chief=False)).restore()
    RunRecord(trainer, RunDirectory(model_dir)).restore(writable=False)  # --mode=eval beside a training run.
    assert tf.io.gfile.exists(leftover)
    RunRecord(trainer, RunDirectory(model_dir)).restore()
    assert not tf.io.gfile.exists(leftover) and tf.io.gfile.isdir(join(model_dir, "export"))


# train.py with tf.io.gfile.copy patched to SIGKILL the process at the second file copied into export/20/: the
# SavedModel is complete in export/.20.tmp-*/, export/20/ holds one stray file and no saved_model.pb.
KILLED_MID_EXPORT = """import os, signal, sys
import tensorflow as tf
import train
copy, copies = tf.io.gfile.copy, []
def copy_then_die(source, destination, overwrite=False):
    if '/export/20/' in destination:
        copies.append(destination)
        if len(copies) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return copy(source, destination, overwrite)
tf.io.gfile.copy = copy_then_die
sys.exit(train.main(['train.py'] + sys.argv[1:]))
"""
TINY = ["--gin_param=TRAIN_STEPS=20", "--gin_param=STEPS_PER_LOOP=10", "--gin_param=EVAL_EVERY=0",
        "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=cosine.warmup_steps=5"]


@pytest.mark.slow
def test_train_py_killed_mid_export_on_gcs_then_rerun_exports_and_leaves_no_temporary_objects(gcs, gcs_bucket,
                                                                                                 data_dir):
    model_dir = f"gs://{gcs_bucket}/run"
    arguments = [*TINY, f"--gin_param=DATA_DIR='{data_dir}'", f"--model_dir={model_dir}"]
    production = {key: value for key, value in os.environ.items() if key not in EARLY_ENVIRONMENT}

    killed = subprocess.run([sys.executable, "-c", KILLED_MID_EXPORT, *arguments], cwd=REPO_ROOT, env=production,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    names = gcs.object_names(gcs_bucket, "run/")
    temporary = [name for name in names if name.startswith("run/export/.20.tmp-")]
    assert any(name.endswith("/saved_model.pb") for name in temporary), names  # Killed mid-copy, as planned.
    assert "run/export/20/saved_model.pb" not in names and any(name.startswith("run/export/20/") for name in names)
    # What other kills leave (seen on gs:// after SIGKILLs), and what versions before the fix copied to 'x//y'.
    for name in ("run/checkpoints/checkpoint.tmp" + "a" * 32, "run/best/ckpt-20_temp/part-00000-of-00001.index",
                 "run/export/20/variables//variables.data-00000-of-00001"):
        gcs.plant_object(gcs_bucket, name)

    rerun = subprocess.run([sys.executable, "train.py", *arguments], cwd=REPO_ROOT, env=production,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "Removed 4 temporary file(s) a killed run left in" in rerun.stdout, rerun.stdout
    names = gcs.object_names(gcs_bucket, "run/")
    assert not [name for name in names if ".tmp" in name or "_temp" in name or "//" in name], names
    assert "run/export/20/saved_model.pb" in names
    serving = tf.saved_model.load(f"{model_dir}/export/20").signatures["serving_default"]
    images = tf.constant(np.random.default_rng(0).integers(0, 17, (3, 8, 8, 1)), tf.uint8)
    probabilities = serving(images=images)["probabilities"].numpy()
    assert probabilities.shape == (3, 10) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
