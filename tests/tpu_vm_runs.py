"""Running scripts/tpu_vm.py in tests: `launch` it (dry runs), read the commands it printed, and `fake_cloud`, which
runs it against tests/fake_gcloud.py (a stand-in `gcloud` on PATH): the `fake_gcloud` fixture of conftest.py, for
tests/test_tpu_vm_launcher.py and tests/test_tpu_vm_input_vms.py."""

import json
import os
import shutil
import subprocess
import sys

from tests.fake_gcloud import FAKE_TRAIN, kill_jobs
from tests.helpers import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "scripts", "tpu_vm.py")
TRAIN_ARGS = ["--", "--gin_file=configs/tpu/cifar10_resnet_v3_32_pod.gin", "--model_dir=gs://bucket/run"]
FAST = ["--poll_seconds=0.05", "--retry_seconds=0.01", "--queue_poll_seconds=0.01"]


def launch(*args: str, env: dict | None = None, script: str = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, "--name=my-tpu", "--zone=us-central1-a", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, errors="backslashreplace", timeout=120,
                          env={**os.environ, **(env or {})})


def commands(stdout: str) -> list[str]:
    """The gcloud commands the launcher printed (`+ gcloud ...`), in order."""
    return [chunk.rstrip() for chunk in ("\n" + stdout).split("\n+ ")[1:]]


def job_script(stdout: str) -> str:
    """The job's script as the launcher prints it before sending it (base64-encoded) to worker 0."""
    lines = stdout.split("[tpu_vm] the job's script", 1)[1].splitlines()[1:]
    return "\n".join(line[4:] for line in lines[:next(i for i, line in enumerate(lines) if line[:4] != "    ")])


def verb(call: list[str]) -> str:
    """A gcloud call's kind: tpu-vm:create, queued-resources:delete, instances:create, compute:ssh, ..."""
    if call[:2] == ["compute", "tpus"]:
        return f"{call[2]}:{call[3]}"
    return f"instances:{call[2]}" if call[:2] == ["compute", "instances"] else f"compute:{call[1]}"


def fake_cloud(tmp_path):
    """A fake cloud in `tmp_path`: run(scenario, train_plan, *flags) runs the launcher against tests/fake_gcloud.py
    and returns (result, verbs); run.stop() kills any job or tf.data service left running on the fake worker and
    input VMs."""
    home = tmp_path / "home" / "tpu-template" / ".venv" / "bin"
    home.mkdir(parents=True)
    (home / "python").write_text(FAKE_TRAIN.format(python=sys.executable))
    (home / "python").chmod(0o755)
    (tmp_path / "gcloud").write_text(f"#!/bin/sh\nexec {sys.executable} {REPO_ROOT}/tests/fake_gcloud.py \"$@\"\n")
    (tmp_path / "gcloud").chmod(0o755)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp_path),
           "FAKE_GCLOUD_DIR": str(tmp_path)}
    input_homes = tmp_path / "input-homes"

    def stop_input_vms():
        for vm_home in input_homes.iterdir() if input_homes.exists() else []:
            kill_jobs(str(vm_home))

    def write(scenario: dict, train_plan: list[dict], fresh: bool = True):
        """A fresh cloud: no counters, calls, TPU or job files (fresh=False keeps the input VMs, as --keep does)."""
        for leftover in [*tmp_path.glob("*.count"), tmp_path / "calls.jsonl", tmp_path / "state.txt",
                         tmp_path / "home" / "attempts", *([tmp_path / "instances.json"] if fresh else [])]:
            leftover.unlink(missing_ok=True)
        if fresh:
            stop_input_vms()
            shutil.rmtree(input_homes, ignore_errors=True)
        (tmp_path / "scenario.json").write_text(json.dumps(scenario))
        (tmp_path / "home" / "train_plan.json").write_text(json.dumps(train_plan))

    def verbs() -> list[str]:
        if not (tmp_path / "calls.jsonl").exists():
            return []
        return [verb(json.loads(line)) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]

    def run(scenario: dict, train_plan: list[dict], *flags: str, accelerator_type: str = "v5litepod-8",
            train_args: list[str] = TRAIN_ARGS, script: str = SCRIPT, extra_env: dict | None = None,
            fresh: bool = True):
        write(scenario, train_plan, fresh)
        result = launch(f"--accelerator_type={accelerator_type}", "--version=v2-alpha-tpuv5-lite", *FAST, *flags,
                        *train_args, env={**env, **(extra_env or {})}, script=script)
        return result, verbs()

    def stop():
        kill_jobs(str(tmp_path / "home"))
        stop_input_vms()

    run.env, run.write, run.verbs, run.stop = env, write, verbs, stop
    return run
