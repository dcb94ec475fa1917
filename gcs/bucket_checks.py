"""Checks the gs:// buckets of a run before anything expensive starts, with google-cloud-storage.

For DATA_DIR and model_dir (whichever are gs:// paths): the bucket exists, the current credentials can write to
it (a probe object is created under the path and deleted), and when the TPU's zone is known
(`experiment.tpu_zone`) the bucket is in that region (cross-region reads are slow and billed). Credentials are
Application Default Credentials only (`gcloud auth application-default login`, a TPU VM's service account, Colab's
`auth.authenticate_user()`); nothing about them is printed except the account's e-mail where it has one.
A failure is a ConfigError (exit 2) that names the bucket and the fix, before any TPU time is spent; a bucket that
does not answer (unreachable, 5xx, 429) is a StorageError (exit 6: a rerun can succeed), after retries bounded by
`timeout_seconds` (experiment.storage_timeout_seconds).
"""

import logging
import os
import re
import uuid

from common.errors import ConfigError, StorageError
from common.storage_errors import describe, transient
from common.storage_wait import reporting

log = logging.getLogger(__name__)

# Cloud Storage bucket names: lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit.
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_PLACEHOLDERS = {"YOUR_BUCKET", "BUCKET", "YOUR-BUCKET", "MY_BUCKET"}
# Multi-region locations and the region-name prefixes they cover.
_MULTI_REGIONS = {"US": "us-", "EU": "europe-", "ASIA": "asia-"}


def split_gs_path(path: str) -> tuple[str, str]:
    """'gs://bucket/a/b' -> ('bucket', 'a/b')."""
    bucket, _, prefix = path[len("gs://"):].partition("/")
    return bucket, prefix.strip("/")


def region_of_zone(zone: str) -> str:
    """'us-central1-b' -> 'us-central1'."""
    return zone.rsplit("-", 1)[0]


def location_serves_region(location: str, region: str) -> bool | None:
    """True/False when the bucket location is (in) the region; None when it cannot tell (dual-regions)."""
    location = location.upper()
    if location in _MULTI_REGIONS:
        return region.startswith(_MULTI_REGIONS[location])
    if "-" in location:
        return location.lower() == region
    return None


def check_bucket_name(name: str, path: str) -> None:
    """A ConfigError naming `path` when its bucket is not a valid Cloud Storage bucket name (such as the configs'
    placeholder gs://YOUR_BUCKET), before any credentials or network are needed."""
    bucket, prefix = split_gs_path(path)
    if _BUCKET_NAME.fullmatch(bucket):
        return
    setting = (f"--gin_param=\"DATA_DIR='gs://my-bucket/{prefix}'\"" if name == "DATA_DIR"
               else f"--{name}=gs://my-bucket/{prefix}")
    placeholder = " (the configs' placeholder)" if bucket.upper() in _PLACEHOLDERS else ""
    raise ConfigError(f"{name}={path!r}: {bucket!r}{placeholder} is not a Cloud Storage bucket name (3-63 lowercase "
                      f"letters, digits, '-', '_' or '.'). Pass your own bucket, e.g. {setting}, in the TPU's region, "
                      "with the data staged there (python -m stage ... --data_dir=gs://my-bucket/"
                      "tensorflow_datasets).")


def check_single_slashes(name: str, path: str) -> None:
    """A ConfigError when `path` has an empty folder name ('gs://b//run', 'gs://b/a//x'; often an unset shell
    variable): Cloud Storage keeps 'a//x' and 'a/x' apart, so the run would write where nothing else looks."""
    bucket, _, prefix = path[len("gs://"):].partition("/")
    if "//" not in prefix and not prefix.startswith("/"):
        return
    meant = "/".join(["gs:/", bucket, *filter(None, prefix.split("/"))])
    if name == "DATA_DIR":
        flag = f"--gin_param=\"DATA_DIR='{meant}'\""
    else:
        flag = f"--{name.lstrip('-')}={meant}"
    raise ConfigError(f"{name}={path!r} has an empty folder name ('//'): Cloud Storage keeps 'a//b' and 'a/b' apart, "
                      f"so it would hold objects under names no one means. Write single slashes: {flag}.")


def check_gcs_paths(paths: dict, *, tpu_zone: str | None = None, client=None, timeout_seconds: float = 120) -> None:
    """Checks every gs:// value of `paths` ({'DATA_DIR': ..., 'model_dir': ...}); a ConfigError on the first problem,
    a StorageError (naming the seconds it waited) when a bucket does not answer within retries bounded by
    `timeout_seconds`."""
    gcs_paths = {name: path for name, path in paths.items() if isinstance(path, str) and path.startswith("gs://")}
    if not gcs_paths:
        return
    for name, path in gcs_paths.items():
        check_bucket_name(name, path)
        check_single_slashes(name, path)
    client = client or default_client(gcs_paths)
    account = getattr(getattr(client, "_credentials", None), "service_account_email", None)
    who = f"the account {account}" if account else "your Application Default Credentials"
    for name, path in gcs_paths.items():
        with reporting(f"gs://{split_gs_path(path)[0]} ({name})") as waited:
            try:
                _check_bucket(client, name, path, who, tpu_zone, timeout_seconds)
            except Exception as error:  # noqa: BLE001 - google-cloud-storage and requests errors alike.
                if isinstance(error, ConfigError) or not transient(error):
                    raise
                # The time it really waited: the retries stop when their next back-off would cross the bound.
                seconds = waited()
                raise StorageError(f"{name}={path!r}: gs://{split_gs_path(path)[0]} did not answer in "
                                   f"{seconds:.{0 if seconds >= 10 else 1}f} s of retries (bounded by "
                                   f"experiment.storage_timeout_seconds={timeout_seconds:g}; {describe(error, 200)}). "
                                   "Nothing was written: rerun the same command once the storage answers.") \
                    from error


def _check_bucket(client, name: str, path: str, who: str, tpu_zone: str | None, timeout_seconds: float) -> None:
    """The checks of check_gcs_paths for one path; a ConfigError on the first problem."""
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    retry = DEFAULT_RETRY.with_timeout(timeout_seconds)  # A bucket that does not answer: a StorageError after this.
    bucket_name, prefix = split_gs_path(path)
    try:
        bucket = client.lookup_bucket(bucket_name, timeout=30, retry=retry)
    except exceptions.Forbidden:
        bucket = client.bucket(bucket_name)  # Listing buckets may be denied while writing is allowed.
    except exceptions.GoogleAPIError as error:
        if transient(error):
            raise
        raise ConfigError(f"{name}={path!r}: could not reach bucket gs://{bucket_name} ({error}).") from error
    if bucket is None:
        raise ConfigError(f"{name}={path!r}: bucket gs://{bucket_name} does not exist (or {who} cannot see it). "
                          f"Create it in the TPU's region: gcloud storage buckets create gs://{bucket_name} "
                          "--location=REGION.")
    probe = bucket.blob("/".join(filter(None, [prefix, f".write-probe-{uuid.uuid4().hex}"])))
    try:
        probe.upload_from_string(b"", timeout=30, retry=retry)
        probe.delete(timeout=30, retry=retry)
    except exceptions.Forbidden as error:
        raise ConfigError(f"{name}={path!r}: {who} cannot write to gs://{bucket_name} (403). Grant it "
                          f"roles/storage.objectAdmin on the bucket (gcloud storage buckets add-iam-policy-binding "
                          f"gs://{bucket_name} --member=... --role=roles/storage.objectAdmin), or use a bucket "
                          "you can write to.") from error
    except exceptions.GoogleAPIError as error:
        if transient(error):
            raise
        raise ConfigError(f"{name}={path!r}: writing a test object to gs://{bucket_name} failed ({error}).") \
            from error
    if tpu_zone and bucket.location:
        region = region_of_zone(tpu_zone)
        if location_serves_region(bucket.location, region) is False:
            raise ConfigError(f"{name}={path!r}: bucket gs://{bucket_name} is in {bucket.location}, the TPU in "
                              f"{tpu_zone} ({region}): every read crosses regions (slow, billed). Use a bucket in "
                              f"{region}, or set experiment.tpu_zone to the TPU's real zone.")
    log.info("%s on gs://%s: exists, writable%s.", name, bucket_name,
             f", location {bucket.location}" if bucket.location else "")


def default_client(paths: dict | None = None):
    """A google-cloud-storage client on Application Default Credentials (or the emulator's, in tests); `paths`
    ({setting: gs:// path}) are named if there are no credentials."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return storage.Client()  # The client picks anonymous credentials for an emulator.
    try:
        credentials, project = google.auth.default()
    except DefaultCredentialsError as error:
        named = ", ".join(f"{name}={path!r}" for name, path in (paths or {}).items()) or "gs:// paths"
        raise ConfigError(f"{named} need Google Cloud credentials and none were found: run `gcloud auth "
                          "application-default login` (on Colab: google.colab.auth.authenticate_user(); on a TPU VM "
                          "its service account is used), or use local paths.") from error
    return storage.Client(credentials=credentials, project=project)
