"""What of this checkout scripts/tpu_vm.py sends to every TPU worker, and the archive that carries it.

Why: a copy of the working tree would carry whatever lies in it, not only the code: an untracked `.env`, `key.json`,
`.ssh/`, `*.pem`, other virtualenvs, downloaded datasets. So the rule is the files git tracks (`git ls-files`: the
index, so `git add`ed new files count, and modified files go in their working-tree state), plus the paths the user
names with `--include`; nothing else. A file git tracks is sent wherever it lies (a tracked `data/runs/keep.py`
too); a tracked file deleted here is not. Symbolic links are sent as links, never the files they point to. A folder
that is not a git checkout (a downloaded zip) is refused: there is no list of what is code and what is not.
"""

import dataclasses
import os
import subprocess
import tarfile

SHOWN_UNTRACKED = 5  # Untracked files named in the summary (the rest are counted).
REMOTE_DIR = "tpu-template"  # Where the archive is unpacked, in the home directory of each machine it is sent to.
# Unpacks the archive (sent as ~/REMOTE_DIR.tgz) and installs `requirements` in a Python 3.11 virtualenv there: the
# TPU workers' requirements-tpu.txt, the CPU VMs' requirements.txt (scripts/input_vms.py).
INSTALL = ("sudo apt-get update -qq && sudo apt-get install -y -qq python3.11 python3.11-venv && "
           f"mkdir -p ~/{REMOTE_DIR} && tar xzf ~/{REMOTE_DIR}.tgz -C ~/{REMOTE_DIR} && cd ~/{REMOTE_DIR} && "
           "python3.11 -m venv .venv && .venv/bin/pip install -q -r {requirements}")


class SourceError(ValueError):
    """The files to send cannot be decided (not a git checkout, an --include that does not exist or lies outside)."""


@dataclasses.dataclass(frozen=True)
class SourceFiles:
    root: str
    tracked: tuple[str, ...]  # Paths relative to root, as git lists them.
    included: tuple[str, ...]  # From --include and not tracked.
    untracked: tuple[str, ...]  # Neither tracked nor ignored nor included: not sent, named so nothing is missed.
    size: int  # Bytes of the regular files sent (before compression).

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted(self.tracked + self.included))

    def summary(self) -> str:
        """One line: how many files and bytes go, from where, and the untracked files that stay here."""
        text = (f"sending {len(self.paths)} files ({self.size / 1e6:.1f} MB) to every worker: the {len(self.tracked)} "
                "that git tracks, as they are here (uncommitted changes included)")
        text += f" and {len(self.included)} from --include" if self.included else ""
        if self.untracked:
            shown = ", ".join(self.untracked[:SHOWN_UNTRACKED])
            more = f" and {len(self.untracked) - SHOWN_UNTRACKED} more" if len(self.untracked) > SHOWN_UNTRACKED else ""
            text += (f"; not sent: {len(self.untracked)} untracked file(s) ({shown}{more}): `git add` them or pass "
                     "--include=PATH if the workers need them")
        return text + "."


def _git(root: str, *args: str) -> list[str]:
    """The NUL-separated paths a git command prints, relative to root."""
    try:
        result = subprocess.run(["git", "-C", root, *args], capture_output=True, check=False)
    except FileNotFoundError:
        raise SourceError(f"{root} cannot be listed: git is not installed. {_FIX}") from None
    if result.returncode:
        reason = os.fsdecode(result.stderr).strip().splitlines()[-1:] or [f"exit {result.returncode}"]
        raise SourceError(f"{root} is not a git checkout (git: {reason[0]}). {_FIX}")
    return [os.fsdecode(path) for path in result.stdout.split(b"\0") if path]


_FIX = ("The launcher sends only the files git tracks, so that untracked files (keys, .env, datasets, virtualenvs) "
        "never reach the TPU workers. Fix: clone the template with git; or, in a downloaded copy, run `git init && "
        "git add -A`, check that `git status` lists only what the workers need, and launch again.")


def _files_under(root: str, relative: str) -> list[str]:
    """`relative` if it is a file or link, else every file and link below it (links to folders not followed)."""
    full = os.path.join(root, relative)
    if os.path.islink(full) or not os.path.isdir(full):
        return [relative]
    found = []
    for folder, subfolders, names in os.walk(full):
        names += [name for name in subfolders if os.path.islink(os.path.join(folder, name))]
        found += [os.path.relpath(os.path.join(folder, name), root) for name in names]
    return found


def _included(root: str, includes: list[str]) -> list[str]:
    paths = []
    for include in includes:
        relative = os.path.normpath(os.path.relpath(os.path.join(root, include), root))
        if relative == ".." or relative.startswith(".." + os.sep) or os.path.isabs(relative):
            raise SourceError(f"--include={include!r} lies outside {root}: only paths inside the checkout can be sent.")
        if not os.path.lexists(os.path.join(root, relative)):
            raise SourceError(f"--include={include!r}: {os.path.join(root, relative)} does not exist. Pass a file or "
                              "folder inside the checkout, relative to its top.")
        paths += _files_under(root, relative)
    return paths


def select(root: str, includes: list[str] = ()) -> SourceFiles:
    """The files to send from the checkout at `root`: tracked ones that exist here, plus `includes` (files, or
    folders sent whole, relative to root). Raises SourceError when root is not a git checkout."""
    root = os.path.abspath(root)
    tracked = [path for path in _git(root, "ls-files", "-z", "--cached", "--recurse-submodules")
               if os.path.islink(os.path.join(root, path)) or os.path.isfile(os.path.join(root, path))]
    tracked_set = set(tracked)
    included = sorted({os.path.normpath(path) for path in _included(root, list(includes))} - tracked_set)
    sent = tracked_set | set(included)
    if "train.py" not in sent:  # E.g. a downloaded copy inside another repository (a home folder under git).
        raise SourceError(f"git tracks no train.py in {root} ({len(tracked)} tracked files there), so the workers "
                          f"would have nothing to run. {_FIX}")
    untracked = [path for path in _git(root, "ls-files", "-z", "--others", "--exclude-standard") if path not in sent]
    size = sum(os.lstat(os.path.join(root, path)).st_size for path in sent
               if not os.path.islink(os.path.join(root, path)))
    return SourceFiles(root, tuple(sorted(tracked)), tuple(included), tuple(sorted(untracked)), size)


def _anonymous(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """No local user or group names in the archive: the workers' user owns what it unpacks."""
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


def write_archive(files: SourceFiles, path: str) -> int:
    """Writes the gzipped tar of `files` (paths relative to the checkout's top) to `path`; returns its size."""
    with tarfile.open(path, "w:gz") as archive:
        for relative in files.paths:
            archive.add(os.path.join(files.root, relative), arcname=relative, recursive=False, filter=_anonymous)
    return os.path.getsize(path)
