"""Paths built from parts and from listings (common/storage_paths.py), on local folders and on gs:// with exact object
names (tests/gcs_server/: the memory backend, as strict as GCS), and a source check that nothing else lists folders.

The defect this guards against: gs:// listings end sub-folders with '/', so `f"{folder}/{name}"` on
`tf.io.gfile.walk` read 'variables//variables.data-...', which does not exist on GCS: every gs:// export failed.
"""

import ast
import glob
import os

import pytest
import tensorflow as tf

from common.storage_paths import entry_path, files_under, has_empty_segment, join, list_folder, relative_to
from tests.helpers import REPO_ROOT

LISTING_CALLS = {"listdir", "walk", "list_directory", "walk_v2"}


def test_join_puts_one_slash_between_parts_and_keeps_the_base():
    assert join("gs://b/run", "export", "20") == "gs://b/run/export/20"
    assert join("gs://b/run/", "/export/", "variables/", "v") == "gs://b/run/export/variables/v"
    assert join("gs://b", "a//b", "", "c") == "gs://b/a/b/c"  # No '//' inside a part either; empty parts skipped.
    assert join("gs://", "b", "x") == "gs://b/x"
    assert join("/", "tmp", "x") == "/tmp/x" and join("runs/a/", "metrics.json") == "runs/a/metrics.json"
    assert join("", "a", "b") == "a/b" and join("gs://b/run") == "gs://b/run"
    assert join("/tmp", "/etc") == "/tmp/etc"  # Not os.path.join's reset to the absolute part.
    for parts in (("x/", "/y"), ("x//", "y/"), ("/x", "y//z")):
        assert not has_empty_segment(join("gs://b/", *parts))


def test_entry_path_adds_only_the_separator_the_folder_lacks():
    assert entry_path("gs://b/x", "variables/") == "gs://b/x/variables/"
    assert entry_path("gs://b/x/variables/", "v.data") == "gs://b/x/variables/v.data"
    assert entry_path("gs://b/x/variables/", "/") == "gs://b/x/variables//"  # The empty-named folder of 'variables//v'.
    assert entry_path("/tmp/x", "a") == "/tmp/x/a"
    assert relative_to("gs://b/x/variables/v", "gs://b/x") == "variables/v" == relative_to("gs://b/x/variables/v",
                                                                                             "gs://b/x/")
    with pytest.raises(ValueError, match="not below"):
        relative_to("gs://b/xy/v", "gs://b/x")
    assert has_empty_segment("gs://b/a//x") and has_empty_segment("gs://b//x")
    assert not has_empty_segment("gs://b/a/x") and not has_empty_segment("/tmp//x")  # Local: 'a//b' is 'a/b'.


def _write(path: str, data: str = "x") -> None:
    tf.io.gfile.makedirs(path.rsplit("/", 1)[0])
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(data)


@pytest.mark.parametrize("where", ["local", "gs"])
def test_listings_name_folders_and_files_and_give_exact_paths(where, tmp_path, request):
    root = str(tmp_path / "x") if where == "local" else f"gs://{request.getfixturevalue('gcs_bucket')}/x"
    for name in ("saved_model.pb", "variables/variables.index", "variables/variables.data-00000-of-00001",
                 "assets/deep/vocab.txt"):
        _write(join(root, name))
    assert list_folder(root).folders == ["assets", "variables"] and list_folder(root).files == ["saved_model.pb"]
    assert list_folder(join(root, "variables")).files == ["variables.data-00000-of-00001", "variables.index"]
    files = files_under(root)
    assert [relative_to(path, root) for path in files] == [
        "assets/deep/vocab.txt", "saved_model.pb", "variables/variables.data-00000-of-00001",
        "variables/variables.index"]
    assert all(tf.io.gfile.exists(path) for path in files)
    assert files_under(join(root, "nothing-here")) == []
    with pytest.raises(tf.errors.NotFoundError):
        list_folder(join(root, "nothing-here"))


def test_the_old_join_on_a_gs_listing_names_objects_that_do_not_exist(gcs, gcs_bucket):
    """Negative control of the defect: on exact names, the walk's 'variables/' plus '/' plus a name is no object."""
    root = f"gs://{gcs_bucket}/x"
    _write(join(root, "variables/variables.index"))
    old_join = [f"{folder}/{name}" for folder, _, names in tf.io.gfile.walk(root) for name in names]
    assert old_join == [f"{root}/variables//variables.index"]
    assert not tf.io.gfile.exists(old_join[0])
    with pytest.raises(tf.errors.NotFoundError):
        tf.io.gfile.GFile(old_join[0], "rb").read()
    assert files_under(root) == [f"{root}/variables/variables.index"]


def test_objects_named_with_a_double_slash_are_listed_as_they_are_named(gcs, gcs_bucket):
    """What old versions left ('export/20/variables//v', 'run//x') is found under its exact name (to be removed)."""
    root = f"gs://{gcs_bucket}/run"
    for name in ("run/export/20/variables//v", "run//top", "run/ok"):
        gcs.plant_object(gcs_bucket, name)
    assert files_under(root) == [f"{root}//top", f"{root}/export/20/variables//v", f"{root}/ok"]
    assert list_folder(root).folders == ["export"] and list_folder(root).files == ["ok"]  # '//' is not a name ...
    for path in files_under(root):  # ... but every exact path reads back.
        assert tf.io.gfile.GFile(path, "rb").read() == b"x"


def listing_calls(root: str) -> list[str]:
    """'file:line call' of every folder listing through TensorFlow's filesystems (tf.io.gfile.listdir/walk, ...: the
    ones that reach gs://) in the product's Python files under `root`, except common/storage_paths.py, through which
    every such listing must go. os.listdir/os.walk see local folders only (the predict command's inputs, the TPU
    launcher's checkout), where no listing entry ends in '/'."""
    found = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        relative = os.path.relpath(path, root)
        if relative.startswith((".venv", "tests" + os.sep)) or relative == os.path.join("common", "storage_paths.py"):
            continue
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in LISTING_CALLS and "gfile" in ast.unparse(node.func):
                found.append(f"{relative}:{node.lineno} {ast.unparse(node.func)}")
    return found


def test_only_the_path_module_lists_folders():
    """Listings are where gs:// hands out 'name/' entries: nothing else may turn them into paths."""
    assert listing_calls(REPO_ROOT) == [], "list folders with common/storage_paths.py (list_folder, files_under)"


def test_the_listing_check_reports_the_old_export_copy(tmp_path):
    """Negative control: the export copy as it was (walk + f-string join) is reported."""
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "export.py").write_text(
        "import tensorflow as tf\n\n\ndef _move(source, target):\n"
        "    return [f'{folder}/{name}' for folder, _, names in tf.io.gfile.walk(source) for name in names]\n")
    assert listing_calls(str(tmp_path)) == ["training/export.py:5 tf.io.gfile.walk"]


@pytest.mark.parametrize("backend", ["memory", "filesystem"])
def test_an_export_with_the_old_join_planted_fails_on_either_test_server(backend, small_config, monkeypatch, request):
    """The planted defect fails against the server: the memory backend keeps names exact, and with the filesystem
    backend (which would map 'a//b' onto 'a/b') the proxy answers 404 for such names, as GCS does."""
    from tpu_utils.strategy import make_strategy
    from training.run_directory import export
    from training.trainer import Trainer

    gcs = request.getfixturevalue("gcs" if backend == "memory" else "gcs_persistent")
    target = f"gs://{gcs.new_bucket()}/run/export/5"
    trainer = Trainer(small_config(), make_strategy("default"))

    def old_files_under(root):
        return [f"{folder}/{name}" for folder, _, names in tf.io.gfile.walk(root) for name in names]

    with monkeypatch.context() as planted:
        planted.setattr(export, "files_under", old_files_under)
        with pytest.raises(tf.errors.NotFoundError, match=r"(?s)404 .*\.5\.tmp-[0-9a-f]{8}/[\w.]+//"):
            export.export_saved_model(trainer.model, trainer.task, target)
    assert not tf.io.gfile.exists(f"{target}/saved_model.pb")
    export.export_saved_model(trainer.model, trainer.task, target)  # The helper's paths: the same export works.
    assert tf.saved_model.load(target).signatures["serving_default"] is not None
