"""The gcloud commands of one Cloud TPU VM, for scripts/tpu_vm.py: create it (directly, or through queued resources
that wait for capacity), retry capacity errors with back-off, describe its state, ssh/scp, delete it; and the
`gcloud compute instances|ssh|scp` commands of the CPU VMs in the same zone (scripts/input_vms.py).

Every command is printed before it runs (`+ gcloud ...`), except the launcher's frequent log polls. A dry run
prints the commands and runs none. Commands are argument lists (no local shell); the flags that become parts of
them are checked first (`flag_problem`), so none can pass as another gcloud option or as shell or gin text.
"""

import re
import shlex
import subprocess
import sys
import time

# What gcloud says when a zone has no chips (or the project no quota) for the request: worth waiting for.
CAPACITY_ERROR = re.compile(r"RESOURCE_EXHAUSTED|no more capacity|ZONE_RESOURCE_POOL_EXHAUSTED|stockout|quota",
                            re.IGNORECASE)
QUEUED_READY = "ACTIVE"
QUEUED_GAVE_UP = ("FAILED", "SUSPENDING", "SUSPENDED")
MAX_BACKOFF_SECONDS = 1800
# What Google Cloud accepts (ASCII only): TPU node names and zones are lowercase letters, digits and hyphens (RFC 1035
# labels), project IDs 6-30 of those (or the legacy `domain.com:project`), software versions and server images
# tokens without spaces or shell syntax.
_FLAG_PATTERNS = {
    "name": (r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?", "lowercase letters, digits and hyphens, starting with a letter"),
    "zone": (r"[a-z]+(?:-[a-z]+)*[0-9]+-[a-z]", "a zone such as us-central1-b"),
    "project": (r"(?:[a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]", "a project ID such as my-project-123"),
    "version": (r"[A-Za-z0-9][A-Za-z0-9._-]*", "a TPU software version such as tpu-vm-tf-2.18.0-pjrt"),
    "tpu_server_image": (r"[A-Za-z0-9][A-Za-z0-9_./:@-]*", "an image reference such as gcr.io/PROJECT/IMAGE:TAG "
                                                          "(letters, digits and ./:@_-)"),
    "input_machine_type": (r"[a-z][a-z0-9]{0,15}(?:-[a-z0-9]{1,16}){1,4}", "a Compute Engine machine type such as "
                                                                            "n2-standard-8 or e2-highcpu-16"),
}


class LauncherError(RuntimeError):
    """A step of the launch failed in a way retrying here cannot fix; the message says what and what to do."""


def accepted(flag: str, value: str) -> bool:
    """Whether `value` is what Google Cloud accepts for the launcher's flag `flag` (a key of _FLAG_PATTERNS)."""
    return re.fullmatch(_FLAG_PATTERNS[flag][0], value, re.ASCII) is not None


def flag_problem(args) -> str | None:
    """What is wrong with the launcher's --name, --zone, --project, --version, --tpu_server_image or
    --input_machine_type, or None."""
    for flag, (_, expected) in _FLAG_PATTERNS.items():
        value = getattr(args, flag, None)
        if value is not None and not accepted(flag, value):
            return f"--{flag}={value!r}: expected {expected}."
    return None


class Gcloud:
    """gcloud for the TPU VM `args.name` in `args.zone` (args: scripts/tpu_vm.py's parsed flags)."""

    def __init__(self, args, sleep=time.sleep):
        self.args = args
        self.sleep = sleep
        self.base = ["--zone", args.zone] + (["--project", args.project] if args.project else [])

    def run(self, *command: str, check: bool = True, capture: bool = False, quiet: bool = False,
            text: bool = True) -> subprocess.CompletedProcess:
        if not quiet:
            print("+ " + shlex.join(command), flush=True)
        if self.args.dry_run:
            return subprocess.CompletedProcess(command, 0, stdout="" if text else b"", stderr="" if text else b"")
        result = subprocess.run(command, text=text, capture_output=capture)  # Streams output unless captured.
        if check and result.returncode:
            raise subprocess.CalledProcessError(result.returncode, command, result.stdout, result.stderr)
        return result

    def tpu(self, verb: str, *extra: str, **options) -> subprocess.CompletedProcess:
        return self.run("gcloud", "compute", "tpus", "tpu-vm", verb, self.args.name, *self.base, *extra, **options)

    def queued(self, verb: str, *extra: str, **options) -> subprocess.CompletedProcess:
        return self.run("gcloud", "compute", "tpus", "queued-resources", verb, self.args.name, *self.base, *extra,
                        **options)

    def ssh(self, command: str, worker: str = "0", **options) -> subprocess.CompletedProcess:
        return self.tpu("ssh", f"--worker={worker}", f"--command={command}", **options)

    def instances(self, verb: str, *names_and_flags: str, **options) -> subprocess.CompletedProcess:
        """`gcloud compute instances VERB ...` (Compute Engine VMs) in the TPU's zone and project."""
        return self.run("gcloud", "compute", "instances", verb, *names_and_flags, *self.base, **options)

    def instance_ssh(self, name: str, command: str, **options) -> subprocess.CompletedProcess:
        return self.run("gcloud", "compute", "ssh", name, *self.base, f"--command={command}", **options)

    def create(self) -> None:
        """Creates the TPU VM, retrying capacity errors with back-off; with --queued, waits until it is ACTIVE."""
        args = self.args
        spot = ["--spot"] if args.spot else []
        for attempt in range(args.capacity_retries + 1):
            if args.queued:
                result = self.queued("create", f"--node-id={args.name}", f"--accelerator-type={args.accelerator_type}",
                                     f"--runtime-version={args.version}", *spot, check=False, capture=True)
            else:
                result = self.tpu("create", f"--accelerator-type={args.accelerator_type}", f"--version={args.version}",
                                  *spot, check=False, capture=True)
            output = (result.stdout or "") + (result.stderr or "")
            sys.stdout.write(output)
            if result.returncode == 0:
                break
            if not CAPACITY_ERROR.search(output):
                raise LauncherError(f"creating {args.name} failed (gcloud exit {result.returncode}); see above.")
            if attempt == args.capacity_retries:
                raise LauncherError(f"no capacity for {args.accelerator_type} in {args.zone} after "
                                    f"{args.capacity_retries + 1} tries. Try --queued (waits in Google's queue), "
                                    "--spot, another zone, or raise --capacity_retries.")
            wait = min(args.retry_seconds * 2 ** attempt, MAX_BACKOFF_SECONDS)
            print(f"[tpu_vm] no capacity for {args.accelerator_type} in {args.zone}: retry {attempt + 1} of "
                  f"{args.capacity_retries} in {wait:g} s.", flush=True)
            self.sleep(wait)
        if args.queued and not args.dry_run:
            self._wait_until_active()

    def _wait_until_active(self) -> None:
        args = self.args
        started, last_state, polls = time.monotonic(), None, 0
        while True:
            result = self.queued("describe", "--format=value(state.state)", check=False, capture=True, quiet=True)
            state = (result.stdout or "").strip() or "UNKNOWN"
            minutes = (time.monotonic() - started) / 60
            if state != last_state or polls % 10 == 0:
                print(f"[tpu_vm] queued resource {args.name}: {state} (waited {minutes:.0f} min)", flush=True)
            last_state, polls = state, polls + 1
            if state == QUEUED_READY:
                return
            if state in QUEUED_GAVE_UP:
                raise LauncherError(f"queued resource {args.name} ended in {state}: Google could not provide "
                                    f"{args.accelerator_type} in {args.zone}. Try another zone or --spot.")
            if args.queue_timeout_minutes and minutes >= args.queue_timeout_minutes:
                raise LauncherError(f"queued resource {args.name} still {state} after {minutes:.0f} min "
                                    f"(--queue_timeout_minutes={args.queue_timeout_minutes}).")
            self.sleep(args.queue_poll_seconds)

    def state(self) -> str:
        """The TPU VM's state (READY, PREEMPTED, TERMINATED, ...), NOT_FOUND if it is gone, '' if unknown."""
        result = self.tpu("describe", "--format=value(state)", check=False, capture=True, quiet=True)
        if result.returncode:
            return "NOT_FOUND" if re.search(r"NOT_FOUND|not found", result.stderr or "", re.IGNORECASE) else ""
        return (result.stdout or "").strip()

    @property
    def project_flag(self) -> str:
        return f" --project={self.args.project}" if self.args.project else ""

    def delete(self) -> bool:
        """Deletes the TPU VM (with --queued: the queued resource and its TPU); False if it may still exist."""
        if self.args.queued:
            result = self.queued("delete", "--force", "--quiet", check=False)
        else:
            result = self.tpu("delete", "--quiet", check=False)
        return result.returncode == 0 or self.state() == "NOT_FOUND"

    def delete_command(self) -> str:
        kind, force = ("queued-resources", " --force") if self.args.queued else ("tpu-vm", "")
        return f"gcloud compute tpus {kind} delete {self.args.name} --zone={self.args.zone}{self.project_flag}{force}"
