"""scripts/source_archive.py: what scripts/tpu_vm.py sends to every TPU worker, on real git checkouts.

The rule under test: exactly the files git tracks (in their working-tree state) plus what --include names; never an
untracked secret, virtualenv or dataset; a tracked file is sent wherever it lies (the old `tar --exclude=runs` dropped
every folder named `runs`); a folder that is not a git checkout is refused.
"""

import os
import subprocess
import tarfile

import pytest

from scripts.source_archive import SourceError, select, write_archive

TRACKED = {"train.py": "print('train')\n", "README.md": "read me\n", "data/runs/keep.py": "KEEP = 1\n",
           "configs/a.gin": "A = 1\n", "gone.py": "deleted here, still in git's index\n"}
# What lies in a real checkout and must never reach a worker (ignored or merely untracked).
SECRETS = {".env": "API_KEY=secret\n", "key.json": '{"private_key": "secret"}', ".ssh/id_rsa": "-----BEGIN secret",
           "server.pem": "-----BEGIN secret", "venv2/pyvenv.cfg": "home = /usr/bin\n", "venv2/bin/python": "#!elf",
           "tensorflow_datasets/mnist/data.tfrecord": "records", "runs/r1/checkpoint": "ckpt",
           "models/__pycache__/x.cpython-311.pyc": "pyc"}


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def _write(root, files: dict) -> None:
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)
        with open(os.path.join(root, path), "w") as handle:
            handle.write(text)


@pytest.fixture
def checkout(tmp_path):
    """A git checkout with tracked files (one added with -f inside an ignored `runs` folder name, one staged but never
    committed, one deleted in the working tree, one modified) and untracked secrets next to them."""
    root = tmp_path / "checkout"
    root.mkdir()
    _git(root, "init", "-q")
    _write(root, {".gitignore": "runs/\n__pycache__/\n.venv/\n", **TRACKED})
    _git(root, "add", ".gitignore", "train.py", "README.md", "configs/a.gin", "gone.py")
    _git(root, "add", "-f", "data/runs/keep.py")  # Tracked although `runs/` is ignored: tracked wins.
    os.symlink(os.path.expanduser("~"), root / "home_link")  # A tracked link to outside: sent as a link.
    _git(root, "add", "home_link")
    os.remove(root / "gone.py")
    _write(root, {"README.md": "read me, changed and not committed\n", **SECRETS})
    return root


def test_exactly_the_tracked_files_are_archived_in_their_working_tree_state(checkout, tmp_path):
    files = select(str(checkout))
    expected = sorted([".gitignore", "README.md", "configs/a.gin", "data/runs/keep.py", "home_link", "train.py"])
    assert list(files.paths) == expected
    archive = tmp_path / "sent.tgz"
    assert write_archive(files, str(archive)) == archive.stat().st_size
    with tarfile.open(archive) as sent:
        members = {member.name: member for member in sent.getmembers()}
        assert sorted(members) == expected  # No .env, key.json, .ssh, *.pem, venv2, datasets, runs/, __pycache__.
        assert sent.extractfile("README.md").read() == b"read me, changed and not committed\n"
        assert members["home_link"].issym() and members["home_link"].linkname == os.path.expanduser("~")
        assert {member.uname for member in members.values()} == {""} and members["train.py"].uid == 0
    # The untracked files that are not ignored are named, so a forgotten new module is not silently missing.
    assert {".env", "key.json", ".ssh/id_rsa", "server.pem"} <= set(files.untracked)
    summary = files.summary()
    assert summary.startswith("sending 6 files (0.0 MB) to every worker: the 6 that git tracks")
    assert "untracked file(s)" in summary and "--include=PATH" in summary


def test_include_adds_untracked_files_and_folders_inside_the_checkout_only(checkout, tmp_path):
    files = select(str(checkout), ["key.json", "tensorflow_datasets/", "train.py"])
    assert files.included == ("key.json", "tensorflow_datasets/mnist/data.tfrecord")  # train.py is tracked already.
    assert "key.json" in files.paths and "key.json" not in files.untracked
    assert "from --include" in files.summary()
    with pytest.raises(SourceError, match=r"--include='\.\./elsewhere' lies outside"):
        select(str(checkout), ["../elsewhere"])
    with pytest.raises(SourceError, match=r"--include='nothing.txt': .*does not exist"):
        select(str(checkout), ["nothing.txt"])


def test_a_folder_that_is_not_a_git_checkout_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # Even if the temporary folder lies in a checkout.
    _write(tmp_path / "zip", {"train.py": "", ".env": "API_KEY=secret"})
    with pytest.raises(SourceError) as error:
        select(str(tmp_path / "zip"))
    message = str(error.value)
    assert "is not a git checkout" in message and "git init && git add -A" in message and "git status" in message


def test_a_copy_inside_another_repository_that_tracks_none_of_it_is_refused(tmp_path):
    """A downloaded copy unpacked in a folder under git (a home folder kept in git): git answers, and tracks none
    of the template; sending nothing would fail on the workers."""
    _git(tmp_path, "init", "-q")
    _write(tmp_path / "zip", {"train.py": "", ".env": "API_KEY=secret"})
    with pytest.raises(SourceError, match=r"git tracks no train.py in .*zip \(0 tracked files there\)"):
        select(str(tmp_path / "zip"))
