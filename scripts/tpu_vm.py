"""Train on a Cloud TPU VM from your machine: create it, install, train, stream the logs, delete it.

  python scripts/tpu_vm.py --name=my-tpu --zone=us-central1-b --accelerator_type=v3-8 --version=tpu-vm-tf-2.x.y \\
      -- --gin_file=configs/tpu/cifar10_resnet_v3_8.gin --model_dir=gs://BUCKET/runs/c10
  python scripts/tpu_vm.py ... --dry_run     # print the gcloud commands, run nothing

Steps (each a `gcloud compute tpus tpu-vm` command):
 1. create the TPU VM (`--version` is the TPU software version, e.g. tpu-vm-tf-2.x.y[-pod][-pjrt]: no 2.20 image
    name is documented, so it is a parameter; `--spot` for spot capacity);
 2. copy this working tree to every worker and install requirements-tpu.txt in a Python 3.11 virtualenv there
    (`--worker=all`: on a pod slice every host runs a TPU server and needs the code);
 3. run `train.py ARGS` on worker 0 only. Pod slices (more than 8 chips/cores, i.e. several hosts) are driven by
    TensorFlow's single client: `TPU=<name>` and `TPU_LOAD_LIBRARY=0`; single hosts use `TPU='local'`;
 4. with `--max_restarts N`: if training ends with exit 3 (SIGTERM: maintenance, preemption) or the TPU was
    preempted, recreate the TPU if needed and rerun the same command: it resumes from the gs:// checkpoint;
 5. delete the TPU when training ends, fails or is interrupted (unless `--keep`), so no idle chip is billed.
The exit code is the training command's (0 done, 2 config error, 3 interrupted, 4 non-finite loss).
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOTE_DIR = "tpu-template"  # In the home directory of each worker.
INSTALL = ("sudo apt-get update -qq && sudo apt-get install -y -qq python3.11 python3.11-venv && "
           f"mkdir -p ~/{REMOTE_DIR} && tar xzf ~/{REMOTE_DIR}.tgz -C ~/{REMOTE_DIR} && cd ~/{REMOTE_DIR} && "
           "python3.11 -m venv .venv && .venv/bin/pip install -q -r requirements-tpu.txt")
# PJRT software versions (v5e, v5p, v6e) load libtpu as a pluggable device (shared/notes/tpu-facts.md).
PJRT_ENV = ("export NEXT_PLUGGABLE_DEVICE_USE_C_API=true TF_PLUGGABLE_DEVICE_LIBRARY_PATH=$(.venv/bin/python -c "
            "'import libtpu, os; print(os.path.join(os.path.dirname(libtpu.__file__), \"libtpu.so\"))') && ")
EXIT_INTERRUPTED = 3


def is_multi_host(accelerator_type: str) -> bool:
    """v3-8, v4-8, v5litepod-8: one host; more than 8 cores/chips (v3-32, v4-16, v5litepod-16): a pod slice."""
    match = re.fullmatch(r"v\d+[a-z]*(?:pod)?-(\d+)", accelerator_type)
    if not match:
        raise SystemExit(f"--accelerator_type={accelerator_type!r}: expected e.g. v3-8, v4-8, v3-32, v5litepod-16.")
    return int(match.group(1)) > 8


class Gcloud:
    """Runs (or, in a dry run, prints) gcloud commands for one TPU VM."""

    def __init__(self, args):
        self.args = args
        self.base = ["--zone", args.zone] + (["--project", args.project] if args.project else [])

    def run(self, *command: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
        print("+ " + shlex.join(command), flush=True)
        if self.args.dry_run:
            return subprocess.CompletedProcess(command, 0, stdout="")
        result = subprocess.run(command, text=True, capture_output=capture)  # Streams output unless captured.
        if check and result.returncode:
            raise subprocess.CalledProcessError(result.returncode, command)
        return result

    def tpu(self, verb: str, *extra: str, **options) -> subprocess.CompletedProcess:
        return self.run("gcloud", "compute", "tpus", "tpu-vm", verb, self.args.name, *self.base, *extra, **options)

    def create(self) -> None:
        self.tpu("create", f"--accelerator-type={self.args.accelerator_type}", f"--version={self.args.version}",
                 *(["--spot"] if self.args.spot else []))

    def install(self) -> None:
        archive = os.path.join(tempfile.gettempdir(), f"{REMOTE_DIR}.tgz")
        self.run("tar", "czf", archive, "--exclude=.venv", "--exclude=.git", "--exclude=runs", "--exclude=__pycache__",
                 "--exclude=.pytest_cache",
                 "-C", REPO_ROOT, ".")
        self.run("gcloud", "compute", "tpus", "tpu-vm", "scp", archive, f"{self.args.name}:~/{REMOTE_DIR}.tgz",
                 *self.base, "--worker=all")
        self.tpu("ssh", "--worker=all", f"--command={INSTALL}")

    def train(self, train_args: list[str]) -> int:
        train_args = [*train_args, f"--gin_param=experiment.tpu_zone='{self.args.zone}'"]  # Bucket region check.
        if is_multi_host(self.args.accelerator_type):
            train_args = [*train_args, f"--gin_param=TPU='{self.args.name}'"]
            environment = "export TPU_LOAD_LIBRARY=0 && "  # Leave the chips to the TPU servers on every host.
        else:
            train_args = [*train_args, "--gin_param=TPU='local'"]
            environment = PJRT_ENV if "pjrt" in self.args.version else ""
        command = f"cd ~/{REMOTE_DIR} && {environment}.venv/bin/python train.py {shlex.join(train_args)}"
        return self.tpu("ssh", "--worker=0", f"--command={command}", check=False).returncode

    def state(self) -> str:
        result = self.tpu("describe", "--format=value(state)", check=False, capture=True)
        return (result.stdout or "").strip()

    def delete(self) -> None:
        self.tpu("delete", "--quiet", check=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="TPU VM name (lowercase letters, digits, hyphens)")
    parser.add_argument("--zone", required=True, help="e.g. us-central1-b (the bucket should be in its region)")
    parser.add_argument("--accelerator_type", required=True, help="e.g. v3-8, v4-8, v3-32")
    parser.add_argument("--version", required=True, help="TPU software version, e.g. tpu-vm-tf-2.x.y[-pod][-pjrt]")
    parser.add_argument("--project", default=None, help="GCP project (default: gcloud's)")
    parser.add_argument("--spot", action="store_true", help="spot capacity (cheaper, preemptible)")
    parser.add_argument("--max_restarts", type=int, default=0, help="reruns after preemption or SIGTERM (resume)")
    parser.add_argument("--keep", action="store_true", help="do not delete the TPU at the end")
    parser.add_argument("--skip_create", action="store_true", help="the TPU exists already (still deleted at the end)")
    parser.add_argument("--dry_run", action="store_true", help="print the gcloud commands, run nothing")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of train.py")
    args = parser.parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    is_multi_host(args.accelerator_type)  # Validates it before anything is created.
    gcloud = Gcloud(args)
    code = 1
    try:
        if not args.skip_create:
            gcloud.create()
        gcloud.install()
        for attempt in range(args.max_restarts + 1):
            code = gcloud.train(train_args)
            if code == 0 or attempt == args.max_restarts:
                break
            state = gcloud.state()
            if code != EXIT_INTERRUPTED and state not in ("PREEMPTED", "TERMINATED"):
                break  # A real failure: rerunning would fail the same way.
            print(f"[tpu_vm] training ended with {code} (TPU state {state or 'unknown'}): resuming, restart "
                  f"{attempt + 1} of {args.max_restarts}.", flush=True)
            if state in ("PREEMPTED", "TERMINATED"):
                gcloud.delete()
                gcloud.create()
                gcloud.install()
    except subprocess.CalledProcessError as error:
        print(f"[tpu_vm] failed: {shlex.join(error.cmd)} exited with {error.returncode}.", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("[tpu_vm] interrupted.", file=sys.stderr, flush=True)
        code = EXIT_INTERRUPTED
    finally:
        if args.keep:
            print(f"[tpu_vm] keeping {args.name}: delete it with `gcloud compute tpus tpu-vm delete {args.name} "
                  f"--zone={args.zone}`; it is billed while it exists.", flush=True)
        else:
            gcloud.delete()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
