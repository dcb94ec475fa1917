"""CPU VMs that run the tf.data service for a TPU VM's training: scripts/tpu_vm.py --input_vms=N.

Why: a TPU VM with few CPU cores per chip may not make its batches fast enough (ImageNet's JPEG decoding), and the
tf.data service (DATA_SERVICE, data/service.py) moves the input pipeline to other machines. This creates N Compute
Engine VMs `NAME-input-0..N-1` in the TPU's zone once the TPU exists (TPU capacity is the scarce part, and a queued
TPU may wait for hours), sends them the TPU's archive, installs requirements.txt (CPU TensorFlow, the same version
as the TPU's: client and workers speak one protocol), starts `python -m data.service --port=PORT
--worker_port=PORT+1 --host=INTERNAL_IP` detached on each (scripts/remote_job.py, attempt 0 in each VM's
~/tpu-template/job/) and waits until each says it serves. train.py gets experiment.data_service with their
addresses. Before a rerun, a service that is no longer running (its VM rebooted) is started again. The VMs are
deleted with the TPU and kept with it.

Their scope is cloud-platform, so the services read a gs:// DATA_DIR as the VMs' service account. The TPU VM reaches
them at their internal IPs on PORT and PORT+1: the network must allow it (the default network's
default-allow-internal rule does). Not verified against Google Cloud (none here): the gcloud flags follow Google's
documentation.
"""

import re
import time

from scripts.gcloud import Gcloud, LauncherError, accepted
from scripts.remote_job import parse_poll, poll_command, start_command, started_pid, stop_command
from scripts.source_archive import INSTALL, REMOTE_DIR

MAX_INPUT_VMS = 16
IMAGE = ("--image-family=debian-12", "--image-project=debian-cloud")  # Debian 12 ships Python 3.11 (INSTALL's).
READY = "tf.data service at grpc://"  # What `python -m data.service` prints once it serves.
START_SECONDS = 600  # The longest wait for a service to say it serves (TensorFlow's import on a fresh VM included).
_IP = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
_DATA_SERVICE_SET = re.compile(r"\b(?:DATA_SERVICE|experiment\.data_service)\s*=")
_LOCAL_SERVICE = re.compile(_DATA_SERVICE_SET.pattern + r"\s*['\"]local")


def input_problem(args, *, pod: bool) -> str | None:
    """What is wrong with --input_vms and the train.py arguments that go with it, or None."""
    count = args.input_vms
    if not 0 <= count <= MAX_INPUT_VMS:
        return f"--input_vms={count}: expected 0 (no tf.data service) to {MAX_INPUT_VMS} CPU VMs."
    last = f"{args.name}-input-{count - 1}"
    if count and not accepted("name", last):
        return (f"--name={args.name!r} with --input_vms={count}: the CPU VMs' names ({last}) must be at most 63 "
                "lowercase letters, digits and hyphens; shorten --name.")
    if not 1024 <= args.input_port < 65535:
        return (f"--input_port={args.input_port}: expected a port from 1024 (lower ones need root; the service runs "
                "as your SSH user) to 65534 (each service's worker listens on the next one), e.g. 5050.")
    setting = next((arg for arg in args.train_args if _DATA_SERVICE_SET.search(arg)), None)
    if count and setting:
        return (f"the train.py arguments set the tf.data service ({setting!r}), and --input_vms={count} sets "
                "DATA_SERVICE to its CPU VMs' services: drop that argument, or drop --input_vms.")
    local = next((arg for arg in args.train_args if _LOCAL_SERVICE.search(arg)), None)
    if pod and local:
        return (f"{args.accelerator_type} is a pod slice and the train.py arguments start tf.data services in "
                f"train.py's process ({local!r}), which the slice's other hosts cannot reach (train.py refuses it): "
                "use --input_vms=N instead.")
    return None


class InputVms:
    """The CPU VMs of one launch (none when --input_vms=0: then every method does nothing)."""

    def __init__(self, gcloud: Gcloud, args):
        self.gcloud, self.args = gcloud, args
        self.names = [f"{args.name}-input-{index}" for index in range(args.input_vms)]
        self.ips = {name: f"<internal-IP-of-{name}>" for name in self.names}  # Placeholders in a dry run.
        self.exist = bool(self.names) and args.skip_create  # --skip_create: a --keep launch left them.

    def create(self) -> None:
        """Creates the VMs in one command and learns their internal IPs; LauncherError if that fails (those created
        are deleted with the TPU: `delete` names them all)."""
        if not self.names:
            return
        self.exist = True
        result = self.gcloud.instances("create", *self.names, f"--machine-type={self.args.input_machine_type}",
                                       *IMAGE, "--scopes=cloud-platform", check=False)
        if result.returncode:
            raise LauncherError(f"creating the CPU VMs {', '.join(self.names)} failed (gcloud exit "
                                f"{result.returncode}); see above. Those created are deleted, with the TPU. If "
                                "gcloud said quota (e.g. CPUS), ask for fewer cores (--input_vms, "
                                "--input_machine_type) or raise the quota (Cloud console, IAM & Admin, Quotas).")
        self.learn_ips()

    def learn_ips(self) -> None:
        for name in self.names:
            result = self.gcloud.instances("describe", name, "--format=value(networkInterfaces[0].networkIP)",
                                           check=False, capture=True)
            ip = (result.stdout or "").strip()
            if self.args.dry_run:
                continue
            if result.returncode or not _IP.fullmatch(ip):
                hint = (" With --skip_create the input VMs must exist: give the --input_vms of the --keep launch "
                        "that made them, or drop --skip_create." if self.args.skip_create else "")
                raise LauncherError(f"the internal IP of {name} is unknown (gcloud exit {result.returncode}: "
                                    f"{((result.stdout or '') + (result.stderr or '')).strip()[-300:]!r}).{hint}")
            self.ips[name] = ip

    def send(self, archive: str) -> None:
        """Copies the launch's archive (the TPU's) to every VM."""
        for name in self.names:
            self.gcloud.run("gcloud", "compute", "scp", archive, f"{name}:~/{REMOTE_DIR}.tgz", *self.gcloud.base)

    def install(self) -> None:
        for name in self.names:
            self.gcloud.instance_ssh(name, INSTALL.format(requirements="requirements.txt"))

    def data_service(self) -> str | None:
        """DATA_SERVICE for train.py: every VM's service, in order; None without VMs."""
        port = self.args.input_port
        return ",".join(f"grpc://{self.ips[name]}:{port}" for name in self.names) or None

    def start_all(self) -> None:
        """Starts the service on every VM (after stopping the one a --keep launch left running) and waits until
        each serves."""
        if self.names and self.args.skip_create:
            for name in self.names:
                self._stop(name)
        for name in self.names:
            self._start(name)

    def dead(self) -> list[str]:
        """The VMs whose service no longer runs (no answer over SSH, or its process gone)."""
        dead = []
        for name in self.names:
            poll = self._poll(name)
            if poll is None or not poll.alive:
                why = ("no answer over SSH" if poll is None else "its process is gone" if poll.exit_code is None
                       else f"it exited with {poll.exit_code}")
                print(f"[tpu_vm] the tf.data service on {name} is not running ({why}).", flush=True)
                dead.append(name)
        return dead

    def restart_dead(self, dead: list[str] | None = None) -> None:
        """Before a rerun: starts again every service that no longer runs (its VM rebooted, or it failed); `dead`:
        those already found dead."""
        for name in self.dead() if dead is None else dead:
            print(f"[tpu_vm] starting the tf.data service on {name} again.", flush=True)
            self._start(name)

    def delete(self) -> bool:
        """Deletes the VMs (if this launch created them or was told they exist); False if some still exist, and
        then `names` are those (a VM that was never made, as after a partly failed create, fails the command)."""
        if not self.exist or self.gcloud.instances("delete", *self.names, "--quiet", check=False).returncode == 0:
            return True
        self.names = [name for name in self.names if self.gcloud.instances(
            "describe", name, "--format=value(name)", check=False, capture=True, quiet=True).returncode == 0]
        return not self.names

    def delete_command(self) -> str:
        return (f"gcloud compute instances delete {' '.join(self.names)} --zone={self.args.zone}"
                f"{self.gcloud.project_flag}")

    def _poll(self, name: str):
        result = self.gcloud.instance_ssh(name, poll_command(REMOTE_DIR, 0, 0), check=False, capture=True,
                                          quiet=True, text=False)
        return parse_poll(result.stdout or b"", 0) if result.returncode == 0 else None

    def _stop(self, name: str) -> None:
        self.gcloud.instance_ssh(name, stop_command(REMOTE_DIR, 0), check=False, capture=True)
        deadline = time.monotonic() + 60
        while not self.args.dry_run and time.monotonic() < deadline:
            poll = self._poll(name)
            if poll is not None and not poll.alive:
                return
            self.gcloud.sleep(self.args.poll_seconds)

    def _start(self, name: str) -> None:
        port = self.args.input_port  # The worker on the next port: a firewall rule needs to open just these two.
        argv = [".venv/bin/python", "-m", "data.service", f"--port={port}", f"--worker_port={port + 1}",
                f"--host={self.ips[name]}"]
        print(f"[tpu_vm] starting the tf.data service on {name}: {' '.join(argv)} (log ~/{REMOTE_DIR}/job/0.log "
              "there)", flush=True)
        started = self.gcloud.instance_ssh(name, start_command(REMOTE_DIR, 0, {}, argv), check=False, capture=True)
        if self.args.dry_run:
            return
        if started_pid(started.stdout or "") is None and started.returncode != 255:
            raise LauncherError(f"the tf.data service did not start on {name} (exit {started.returncode}): "
                                f"{((started.stdout or '') + (started.stderr or ''))[-500:]}")
        self._wait_until_serving(name)

    def _wait_until_serving(self, name: str) -> None:
        deadline, dead_polls, log = time.monotonic() + START_SECONDS, 0, ""
        while True:
            poll = self._poll(name)
            log = poll.chunk.decode("utf-8", "replace") if poll is not None else log
            if READY in log:
                print(f"[tpu_vm] {name}: {log[log.index(READY):].splitlines()[0]}", flush=True)
                return
            dead_polls = dead_polls + 1 if poll is not None and not poll.alive else 0
            ended = poll is not None and poll.exit_code is not None
            if ended or dead_polls >= 2 or time.monotonic() > deadline:
                what = (f"exited with {poll.exit_code}" if ended else "died" if dead_polls >= 2 else
                        f"did not say it serves within {START_SECONDS} s")
                tail = "\n".join(f"    {line}" for line in log.splitlines()[-20:]) or "    (empty)"
                raise LauncherError(f"the tf.data service on {name} {what}; the end of its log "
                                    f"(~/{REMOTE_DIR}/job/0.log there):\n{tail}")
            self.gcloud.sleep(self.args.poll_seconds)

