"""The fence of a gs:// run directory: its run's record files are written with generation preconditions, so that a
write started by a run that has since lost its lock is refused by the storage instead of landing.

Why: the run lock (gcs/run_lock.py) makes a holder stop writing once it knows the lock is lost, but a write it
started before it knew (the process frozen by SIGSTOP or a paused VM in the middle of the request) completes when it
thaws: a metrics.jsonl record twice, a summary of steps the new holder has not trained. Here each object is written
with `if_generation_match` = the generation this run last wrote or read (0: absent), and a run that takes a lock
first rewrites, unchanged, every object written through the fence of that lock by earlier holders (each carries
custom metadata naming the lock), before it reads any of them: a write an old holder still has pending names a
generation that is gone, and gets 412.

A refused write asks the lock (`confirm_held`, read back): lost -> RunLockLost (exit 6). Still held -> the object is
this run's own earlier write whose answer was lost (its metadata carries this run's token), or was created after
this run took over where nothing was (no precondition refuses a creation), by a holder that had lost the lock: its
generation is adopted and this run's write replaces it. Appends (metrics.jsonl) read the object under the same
precondition and write it whole. Reads go through TensorFlow as before: a read cannot harm.
"""

import base64
import hashlib
import logging

from common.errors import StorageError
from common.storage_errors import describe, transient

log = logging.getLogger(__name__)

LOCK_KEY = "run-lock"  # Custom metadata: the lock object whose holders write this object.
WRITER_KEY = "run-lock-token"  # Custom metadata: the token of the holder that wrote this generation.
_ATTEMPTS = 3


class GenerationFence:
    """Generation-matched writes to one bucket for the holder of the lock object `lock_name` in it."""

    def __init__(self, bucket, lock_name: str, *, confirm_held, retry, timeout: float = 30):
        """`confirm_held(what)`: raises RunLockLost unless this run still holds the lock (read back now)."""
        self.bucket_name = bucket.name
        self._bucket, self._lock_name = bucket, lock_name
        self._prefix = lock_name.rpartition("/")[0]
        self._below = f"{self._prefix}/" if self._prefix else ""  # The lock's folder, as a prefix of object names.
        self._confirm_held, self._retry, self._timeout = confirm_held, retry, timeout
        self._generations: dict[str, int] = {}  # Object name -> the generation this run last wrote or read.
        self._stale: set[str] = set()  # Objects an old holder created after this run took over: not appended to.
        self._token = None

    def establish(self, token: str) -> int:
        """Right after the lock is taken, before anything below it is read: notes the generation of every object
        below the lock's folder and rewrites those earlier holders wrote through this fence, so that their pending
        writes are refused. Returns how many were rewritten."""
        self._token = token
        folder = f"gs://{self.bucket_name}/{self._prefix}"
        listed = self._call(folder, lambda: list(self._bucket.list_blobs(
            prefix=self._below or None, timeout=self._timeout, retry=self._retry)))
        rewritten = 0
        for blob in listed:
            self._generations[blob.name] = blob.generation
            if blob.name != self._lock_name and (blob.metadata or {}).get(LOCK_KEY) == self._lock_name:
                self._rewrite_as_is(blob.name)
                rewritten += 1
        return rewritten

    def covers(self, path: str) -> bool:
        return path.startswith(f"gs://{self.bucket_name}/")

    def write(self, path: str, text: str) -> None:
        """Writes `text` as the whole object at `path` (one upload: readers never see half of it)."""
        name, data = self._name(path), text.encode()
        for _ in range(_ATTEMPTS):
            try:
                self._upload(name, data, self._known(name))
                return
            except _refusals() as error:
                if self._settle(name, data, error):
                    return
        raise self._unsettled(path)

    def append(self, path: str, text: str) -> None:
        """Appends `text` to the object at `path` (read and written whole, both under the precondition)."""
        name, data = self._name(path), text.encode()
        for _ in range(_ATTEMPTS):
            generation, data = self._known(name), text.encode()
            try:
                if generation and name not in self._stale:
                    data = self._download(name, generation) + data
                self._upload(name, data, generation)
                return
            except _refusals() as error:
                if self._settle(name, data, error):
                    return
        raise self._unsettled(path)

    def _known(self, name: str) -> int:
        """The generation to write `name` over: the one this run last wrote or read; below the lock's folder, 0 if
        it was absent when the lock was taken; elsewhere (e.g. a sidecar's best/) the one it has when first used."""
        if name not in self._generations and not name.startswith(self._below):
            blob = self._call(f"gs://{self.bucket_name}/{name}", self._bucket.get_blob, name, timeout=self._timeout,
                              retry=self._retry)
            self._generations[name] = blob.generation if blob is not None else 0
        return self._generations.get(name, 0)

    def _download(self, name: str, generation: int) -> bytes:
        return self._call(f"gs://{self.bucket_name}/{name}", self._bucket.blob(name).download_as_bytes,
                          if_generation_match=generation, timeout=self._timeout, retry=self._retry)

    def _upload(self, name: str, data: bytes, generation: int) -> None:
        blob = self._bucket.blob(name)
        blob.metadata = {LOCK_KEY: self._lock_name, WRITER_KEY: self._token}
        self._call(f"gs://{self.bucket_name}/{name}", blob.upload_from_string, data,
                   content_type="text/plain; charset=utf-8", if_generation_match=generation, timeout=self._timeout,
                   retry=self._retry)
        self._generations[name] = blob.generation
        self._stale.discard(name)

    def _rewrite_as_is(self, name: str) -> None:
        """Rewrites an object unchanged (a new generation); read again if it changes in between (then a pending
        write of an old holder landed first: this run reads it, as if it had landed before the takeover)."""
        for _ in range(_ATTEMPTS):
            try:
                self._upload(name, self._download(name, self._generations[name]), self._generations[name])
                return
            except _refusals():
                blob = self._call(f"gs://{self.bucket_name}/{name}", self._bucket.get_blob, name,
                                  timeout=self._timeout, retry=self._retry)
                if blob is None:  # Deleted in between: nothing to fence.
                    self._generations[name] = 0
                    return
                self._generations[name] = blob.generation
        raise self._unsettled(f"gs://{self.bucket_name}/{name}")

    def _settle(self, name: str, data: bytes, error: Exception) -> bool:
        """After a refusal (412, or 404 for an object this run knew): adopts the object's generation and returns
        whether it holds this very write already (the answer to this run's own request was lost, and its retry was
        refused). RunLockLost when the lock is no longer this run's."""
        path = f"gs://{self.bucket_name}/{name}"
        current = self._call(path, self._bucket.get_blob, name, timeout=self._timeout, retry=self._retry)
        known, self._generations[name] = self._generations.get(name, 0), current.generation if current else 0
        if current is not None and (current.metadata or {}).get(WRITER_KEY) == self._token:
            return current.md5_hash == base64.b64encode(hashlib.md5(data).digest()).decode()
        self._confirm_held(f"its write of {path}, started before it knew, was refused by the storage "
                           f"({describe(error, 120)})")
        other = (current.metadata or {}).get(LOCK_KEY) if current is not None else None
        if other not in (None, self._lock_name):  # E.g. a sidecar's best/best.json also written by its trainer.
            log.warning("%s was written by the holder of %s while this run holds %s: replaced by this run's (one "
                        "writer per file).", path, other, self._lock_name)
        else:
            log.warning("%s was written after this run took over %s, by a run that no longer holds it (a write "
                        "started before it knew): replaced by this run's.", path, self._lock_name)
        if not known:  # Created where nothing was when this run took over: all of it is the old holder's.
            self._stale.add(name)
        return False

    def _call(self, path: str, method, *args, **kwargs):
        """`method(*args, **kwargs)`; a failure of the storage as a StorageError naming `path` (refusals, 412 and
        404, are the callers')."""
        from google.api_core import exceptions

        try:
            return method(*args, **kwargs)
        except _refusals():
            raise
        except Exception as error:  # noqa: BLE001 - google-cloud-storage and requests errors alike.
            if not isinstance(error, exceptions.GoogleAPIError) and not transient(error):
                raise
            raise StorageError(f"Writing {path} failed ({describe(error)}). Checkpoints saved before it are intact "
                               "(if any): rerun the same command once the storage is fixed.") from error

    def _unsettled(self, path: str) -> StorageError:
        return StorageError(f"Writing {path} failed: it changed {_ATTEMPTS} times while this run held the run lock "
                            "(another tool writing it?). Rerun the same command.")

    def _name(self, path: str) -> str:
        if not self.covers(path):
            raise ValueError(f"{path} is not in gs://{self.bucket_name}/")
        return path[len(f"gs://{self.bucket_name}/"):]


def _refusals() -> tuple[type[Exception], ...]:
    """The storage's answers to a request over a generation that is no longer there."""
    from google.api_core import exceptions

    return exceptions.PreconditionFailed, exceptions.NotFound
