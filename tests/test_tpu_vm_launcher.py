"""scripts/tpu_vm.py: the Cloud TPU VM launcher's commands, checked without a cloud.

The dry run prints the gcloud commands; the failure paths run the real script against a stand-in `gcloud` on PATH
that records its arguments (Google Cloud cannot be reached from here), so that "delete the TPU on failure" and
"resume after SIGTERM" are exercised as real subprocess control flow.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "scripts", "tpu_vm.py")
TRAIN_ARGS = ["--", "--gin_file=configs/tpu/cifar10_resnet_v3_32_pod.gin", "--model_dir=gs://bucket/run"]


def _launch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, "--name=my-pod", "--zone=us-central1-a", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def _commands(stdout: str) -> list[str]:
    return [line[2:] for line in stdout.splitlines() if line.startswith("+ ")]


def test_dry_run_for_a_pod_installs_everywhere_and_trains_on_worker_0():
    result = _launch("--accelerator_type=v3-32", "--version=tpu-vm-tf-2.x.y-pod", "--dry_run", *TRAIN_ARGS)
    assert result.returncode == 0, result.stderr
    commands = _commands(result.stdout)
    assert commands[0].startswith("gcloud compute tpus tpu-vm create my-pod --zone us-central1-a "
                                  "--accelerator-type=v3-32 --version=tpu-vm-tf-2.x.y-pod")
    install = next(command for command in commands if "pip install" in command)
    assert "--worker=all" in install and "requirements-tpu.txt" in install and "python3.11 -m venv" in install
    assert any("scp" in command and "--worker=all" in command for command in commands)
    train = next(command for command in commands if "train.py" in command)
    assert "--worker=0" in train and "--worker=all" not in train
    assert "export TPU_LOAD_LIBRARY=0 && " in train and "TPU=" in train and "my-pod" in train
    assert "experiment.tpu_zone=" in train and "us-central1-a" in train  # The buckets' region is checked.
    assert commands[-1] == "gcloud compute tpus tpu-vm delete my-pod --zone us-central1-a --quiet"


def test_dry_run_for_a_single_host_uses_the_local_tpu():
    result = _launch("--accelerator_type=v5litepod-8", "--version=v2-alpha-tpuv5-lite-pjrt", "--spot", "--dry_run",
                     *TRAIN_ARGS)
    train = next(command for command in _commands(result.stdout) if "train.py" in command)
    assert "TPU_LOAD_LIBRARY" not in train and "local" in train
    assert "NEXT_PLUGGABLE_DEVICE_USE_C_API=true" in train  # A PJRT software version.
    assert "--spot" in _commands(result.stdout)[0]


def test_a_bad_accelerator_type_stops_before_anything_is_created():
    result = _launch("--accelerator_type=v3_8", "--version=x", "--dry_run", *TRAIN_ARGS)
    assert result.returncode != 0 and "--accelerator_type='v3_8'" in result.stderr
    assert not _commands(result.stdout)


@pytest.fixture
def fake_gcloud(tmp_path):
    """A `gcloud` that logs each call; training exits with the next code of TRAIN_EXIT_CODES, describe says READY."""
    log, codes = tmp_path / "calls.jsonl", tmp_path / "codes"
    (tmp_path / "gcloud").write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if 'describe' in sys.argv: print('READY')\n"
        "if any('train.py' in arg for arg in sys.argv):\n"
        f"    codes = open({str(codes)!r}).read().split(',')\n"
        f"    open({str(codes)!r}, 'w').write(','.join(codes[1:]))\n"
        "    sys.exit(int(codes[0]))\n")
    (tmp_path / "gcloud").chmod(0o755)

    def run(train_exit_codes: str, *args: str):
        codes.write_text(train_exit_codes)
        result = _launch("--accelerator_type=v3-8", "--version=tpu-vm-tf-2.x.y", *args, *TRAIN_ARGS,
                         env={"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp_path)})
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        return result, [call[3] if call[:3] == ["compute", "tpus", "tpu-vm"] else call[0] for call in calls]

    return run


def test_a_training_failure_still_deletes_the_tpu_and_returns_its_code(fake_gcloud):
    result, verbs = fake_gcloud("4", "--max_restarts=2")
    assert result.returncode == 4, result.stdout + result.stderr
    # Exit 4 (non-finite loss) on a READY TPU is a real failure: no rerun, and the TPU is deleted.
    assert verbs == ["create", "scp", "ssh", "ssh", "describe", "delete"]


def test_sigterm_exit_is_resumed_then_the_tpu_is_deleted(fake_gcloud):
    result, verbs = fake_gcloud("3,0", "--max_restarts=1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert verbs == ["create", "scp", "ssh", "ssh", "describe", "ssh", "delete"]
    assert "resuming, restart 1 of 1" in result.stdout
