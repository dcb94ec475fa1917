"""scripts/tpu_vm.py --input_vms=N: CPU VMs running the tf.data service for the TPU's training (scripts/input_vms.py).

Against tests/fake_gcloud.py, whose input VMs run the launcher's service commands (start, poll, stop) in a local
bash each, with a fake `python -m data.service`: the services are real detached processes, started, polled, killed
and restarted as on the VMs. What the real gcloud and Compute Engine do with these commands is not checked (none
here); the flags follow Google's documentation.
"""

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from data.service import parse
from scripts.input_vms import MAX_INPUT_VMS
from scripts.pod_runtime import pinned_tensorflow
from tests.helpers import REPO_ROOT
from tests.tpu_vm_runs import FAST, SCRIPT, TRAIN_ARGS, commands, job_script, launch

VMS = ["my-tpu-input-0", "my-tpu-input-1"]
EXPECTED = "--gin_param=experiment.data_service='grpc://10.128.0.2:5050,grpc://10.128.0.3:5050'"


def _fold(verbs: list[str]) -> list[str]:
    """Consecutive repeats folded into one."""
    return [verb for index, verb in enumerate(verbs) if index == 0 or verbs[index - 1] != verb]


def _calls(cloud) -> list[list[str]]:
    with open(os.path.join(cloud.env["FAKE_GCLOUD_DIR"], "calls.jsonl")) as handle:
        return [json.loads(line) for line in handle]


def _vm(cloud, name: str, *path: str) -> str:
    return os.path.join(cloud.env["FAKE_GCLOUD_DIR"], "input-homes", name, *path)


def _json(path: str):
    with open(path) as handle:
        return json.load(handle)


def _service_pid(cloud, name: str) -> int:
    return int(open(_vm(cloud, name, "tpu-template", "job", "0.pid")).read())


def _running(pid: int) -> bool:
    """Whether the process exists and is no zombie (a killed process stays one until it is reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pid: int) -> bool:
    """Whether the process ends within 30 s (signals take a moment)."""
    deadline = time.monotonic() + 30
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def _instances(cloud) -> dict:
    return _json(os.path.join(cloud.env["FAKE_GCLOUD_DIR"], "instances.json"))


def _data_service(argv: list[str]) -> list[str]:
    return [arg for arg in argv if "DATA_SERVICE" in arg.upper()]


def test_a_dry_run_prints_the_input_vms_their_install_their_services_and_data_service():
    result = launch("--accelerator_type=v4-8", "--version=tpu-vm-tf-2.18.0-pjrt", "--input_vms=2",
                    "--input_machine_type=n2-standard-8", "--project=my-project-123", "--dry_run", *TRAIN_ARGS)
    assert result.returncode == 0, result.stderr
    printed = commands(result.stdout)
    base = "--zone us-central1-a --project my-project-123"
    create = printed.index(f"gcloud compute instances create {' '.join(VMS)} --machine-type=n2-standard-8 "
                           f"--image-family=debian-12 --image-project=debian-cloud --scopes=cloud-platform {base}")
    assert printed[0].startswith("gcloud compute tpus tpu-vm create my-tpu") and create == 1  # Once the TPU exists.
    for name in VMS:
        assert (f"gcloud compute instances describe {name} '--format=value(networkInterfaces[0].networkIP)' {base}"
                in printed)
    (tpu_archive,) = [command.split()[5] for command in printed if command.startswith("gcloud compute tpus tpu-vm scp")]
    sends = [command for command in printed if command.startswith("gcloud compute scp ")]
    assert sends == [f"gcloud compute scp {tpu_archive} '{name}:~/tpu-template.tgz' {base}" for name in VMS]
    installs = [command.splitlines()[0] for command in printed  # The lines after it are the launcher's own.
                if command.startswith("gcloud compute ssh") and "pip install" in command]
    assert [command.split()[3] for command in installs] == VMS
    assert all(command.endswith("python3.11 -m venv .venv && .venv/bin/pip install -q -r requirements.txt'")
               for command in installs)
    starts = [command for command in printed if command.startswith("gcloud compute ssh") and "setsid nohup" in command]
    assert [command.split()[3] for command in starts] == VMS
    for name, start in zip(VMS, starts, strict=True):  # What reaches the VM: only base64, decoded to the script.
        script = base64.b64decode(re.search(r"echo (\S+) \| base64 -d > job/0.sh", start).group(1)).decode()
        command = ".venv/bin/python -m data.service --port=5050 --worker_port=5051"
        assert script.startswith(f"{command} '--host=<internal-IP-of-{name}>' &")
        assert f"starting the tf.data service on {name}: {command}" in result.stdout
    placeholders = ",".join(f"grpc://<internal-IP-of-{name}>:5050" for name in VMS)
    assert f"experiment.data_service='\"'\"'{placeholders}'\"'\"'" in job_script(result.stdout)
    assert printed[-2:] == [f"gcloud compute instances delete {' '.join(VMS)} --quiet {base}",
                            f"gcloud compute tpus tpu-vm delete my-tpu {base} --quiet"]


def test_train_py_gets_the_services_of_the_input_vms_which_are_deleted_with_the_tpu(fake_gcloud):
    result, verbs = fake_gcloud({}, [{"lines": 3, "exit": 0}], "--input_vms=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    home = os.path.join(fake_gcloud.env["FAKE_GCLOUD_DIR"], "home")
    argv = _json(os.path.join(home, "argv-0.json"))
    assert _data_service(argv) == [EXPECTED] and argv[-1] == EXPECTED  # Exactly once, last, as train.py got it.
    assert parse(EXPECTED.split("=", 2)[2].strip("'")).addresses == ("10.128.0.2:5050", "10.128.0.3:5050")
    for index, name in enumerate(VMS):
        assert _json(_vm(fake_gcloud, name, "service-argv-0.json")) == [
            "-m", "data.service", "--port=5050", "--worker_port=5051", f"--host=10.128.0.{index + 2}"]
        assert f"[tpu_vm] {name}: tf.data service at grpc://10.128.0.{index + 2}:5050 (fake)" in result.stdout
        assert open(_vm(fake_gcloud, name, "installed")).read().endswith("pip install -q -r requirements.txt")
        with open(_vm(fake_gcloud, name, "tpu-template.tgz"), "rb") as sent, \
                open(os.path.join(home, "tpu-template.tgz"), "rb") as tpus:
            assert sent.read() == tpus.read()  # The TPU's archive.
        assert _gone(_service_pid(fake_gcloud, name))  # Gone with its VM.
    assert _fold(verbs) == ["tpu-vm:create", "instances:create", "instances:describe", "tpu-vm:scp", "compute:scp",
                            "tpu-vm:ssh", "compute:ssh", "tpu-vm:ssh", "instances:delete", "tpu-vm:delete"]
    assert _instances(fake_gcloud) == {}
    delete = [call for call in _calls(fake_gcloud) if call[:3] == ["compute", "instances", "delete"]]
    assert delete == [["compute", "instances", "delete", *VMS, "--quiet", "--zone", "us-central1-a"]]


def test_a_service_that_fails_to_start_ends_the_launch_before_training_and_deletes_everything(fake_gcloud):
    result, verbs = fake_gcloud({"service_plan": {"my-tpu-input-1": ["fail"]}}, [{"lines": 3, "exit": 0}],
                                "--input_vms=2")
    assert result.returncode == 1
    assert "[tpu_vm] failed: the tf.data service on my-tpu-input-1 exited with 1" in result.stderr
    assert "    error: the fake tf.data service failed (service_plan)" in result.stderr  # Its log's end.
    assert not os.path.exists(os.path.join(fake_gcloud.env["FAKE_GCLOUD_DIR"], "home", "argv-0.json"))
    assert verbs.count("tpu-vm:ssh") == 1  # The install only: train.py never started.
    assert verbs[-2:] == ["instances:delete", "tpu-vm:delete"] and _instances(fake_gcloud) == {}
    assert _gone(_service_pid(fake_gcloud, "my-tpu-input-0"))


def test_a_partly_failed_create_of_the_input_vms_deletes_those_made_and_the_tpu(fake_gcloud):
    scenario = {"instances_create_error": "ERROR: (gcloud.compute.instances.create) Quota 'CPUS' exceeded.",
                "instances_created": 1}
    result, verbs = fake_gcloud(scenario, [{"lines": 3, "exit": 0}], "--input_vms=2")
    assert result.returncode == 1 and "Quota 'CPUS' exceeded" in result.stderr
    assert "creating the CPU VMs my-tpu-input-0, my-tpu-input-1 failed (gcloud exit 1)" in result.stderr
    assert verbs == ["tpu-vm:create", "instances:create", "instances:delete", "instances:describe",
                     "instances:describe", "tpu-vm:delete"]  # The delete failed on the VM never made: checked.
    assert _instances(fake_gcloud) == {} and "still billed" not in result.stderr
    assert "ask for fewer cores (--input_vms, --input_machine_type) or raise the quota" in result.stderr


@pytest.mark.parametrize("flags, expected", [
    ([f"--input_vms={MAX_INPUT_VMS + 1}"], f"--input_vms={MAX_INPUT_VMS + 1}: expected 0 (no tf.data service) to "
                                           f"{MAX_INPUT_VMS} CPU VMs"),
    (["--input_vms=-1"], "--input_vms=-1: expected 0"),
    (["--name=" + "a" * 56], "the CPU VMs' names (" + "a" * 56 + "-input-1) must be at most 63"),
    (["--input_machine_type=n2-standard-8;touch x"], "--input_machine_type='n2-standard-8;touch x': expected"),
    (["--input_machine_type=--project=other"], "--input_machine_type='--project=other': expected"),
    (["--input_port=0"], "--input_port=0: expected a port"),
    (["--input_port=80"], "lower ones need root"),
    (["--input_port=65535"], "each service's worker listens on the next one"),
    (["--", "--gin_param=DATA_SERVICE='grpc://10.0.0.5:5050'"], "DATA_SERVICE to its CPU VMs' services: drop"),
    (["--", "--gin_param", "experiment.data_service = 'local'"], "the train.py arguments set the tf.data service"),
])
def test_bad_input_vm_flags_stop_before_any_gcloud_command(fake_gcloud, flags, expected):
    result, verbs = fake_gcloud({}, [], "--input_vms=2", *flags, train_args=[] if "--" in flags else TRAIN_ARGS)
    assert result.returncode == 2 and not verbs, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert expected in result.stderr, result.stderr


def test_local_services_on_a_pod_slice_are_refused_before_anything_is_created():
    """train.py refuses DATA_SERVICE='local' on a pod slice (its other hosts cannot reach this host's loopback): the
    launcher says so before creating the slice. A single host and grpc:// services on a pod pass (positive controls)."""
    local = ["--", "--gin_param=DATA_SERVICE='local:2'"]
    pod = ["--accelerator_type=v3-32", "--version=tpu-vm-tf-2.20.0-pod", "--dry_run"]
    refused = launch(*pod, *local)
    assert refused.returncode == 2 and refused.stderr.startswith("error: v3-32 is a pod slice"), refused.stderr
    assert "use --input_vms=N instead" in refused.stderr and "+ gcloud" not in refused.stdout
    for flags in ([*pod, "--", "--gin_param=DATA_SERVICE='grpc://10.0.0.5:5050'"],
                  ["--accelerator_type=v4-8", "--version=tpu-vm-tf-2.18.0-pjrt", "--dry_run", *local]):
        assert launch(*flags).returncode == 0, flags


def test_the_limits_of_the_input_vm_flags_are_accepted():
    """Positive controls of the refusals above: the longest name, the most VMs, another machine type, and DATA_SERVICE
    in the train.py arguments when the launcher does not set it."""
    for flags in (["--name=" + "a" * 55, "--input_vms=2"],
                  [f"--input_vms={MAX_INPUT_VMS}", "--input_machine_type=e2-highcpu-8"],
                  ["--", "--gin_param=DATA_SERVICE='grpc://10.0.0.5:5050'"]):
        result = launch("--accelerator_type=v4-8", "--version=tpu-vm-tf-2.18.0-pjrt", "--dry_run", *flags)
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("killed", [["my-tpu-input-1"], []])
def test_a_job_that_failed_because_a_service_died_is_rerun_once_the_service_runs_again(fake_gcloud, killed):
    """Attempt 0 ends as train.py does when a service dies (exit 1) after my-tpu-input-1's service was killed (its VM
    rebooted): that service is started again before the rerun, which resumes with the same DATA_SERVICE. Negative
    control: exit 1 with every service running is a failure a rerun would repeat."""
    plan = [{"lines": 3, "exit": 1, "kill_services": killed}, {"lines": 2, "exit": 0}]
    result, verbs = fake_gcloud({}, plan, "--input_vms=2", "--max_restarts=1")
    if not killed:
        assert result.returncode == 1 and "a failure a rerun would repeat; not restarting" in result.stdout
        assert not [name for name in VMS if os.path.exists(_vm(fake_gcloud, name, "service-argv-1.json"))]
        return
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "the tf.data service on my-tpu-input-1 is not running (its process is gone)" in result.stdout
    assert "starting the tf.data service on my-tpu-input-1 again" in result.stdout
    assert "my-tpu-input-0 is not running" not in result.stdout
    assert not os.path.exists(_vm(fake_gcloud, "my-tpu-input-0", "service-argv-1.json"))  # Left running.
    assert _json(_vm(fake_gcloud, "my-tpu-input-1", "service-argv-1.json")) == [
        "-m", "data.service", "--port=5050", "--worker_port=5051", "--host=10.128.0.3"]
    home = os.path.join(fake_gcloud.env["FAKE_GCLOUD_DIR"], "home")
    assert [_data_service(_json(os.path.join(home, f"argv-{attempt}.json"))) for attempt in (0, 1)] == [[EXPECTED]] * 2
    starts = [index for index, call in enumerate(_calls(fake_gcloud))
              if "setsid nohup" in call[-1] and call[1] in ("ssh", "tpus")]
    where = [_calls(fake_gcloud)[index][2] for index in starts]  # compute ssh NAME / compute tpus tpu-vm ...
    assert where == ["my-tpu-input-0", "my-tpu-input-1", "tpu-vm", "my-tpu-input-1", "tpu-vm"]
    assert verbs[-2:] == ["instances:delete", "tpu-vm:delete"]


def test_the_launchers_data_service_wins_over_a_gin_files_binding(fake_gcloud, tmp_path):
    """train.py's arguments as the worker received them, parsed by train.py's own parser with a gin file that binds
    experiment.data_service itself (the launcher cannot read a file on the VM): the input VMs' services win."""
    from training import config_files, experiment

    fake_gcloud({}, [{"lines": 1, "exit": 0}], "--input_vms=2")
    argv = _json(os.path.join(fake_gcloud.env["FAKE_GCLOUD_DIR"], "home", "argv-0.json"))
    gin_file = tmp_path / "own.gin"
    gin_file.write_text("include 'configs/default.gin'\nexperiment.data_service = 'local:2'\n")
    params = [arg.split("=", 1)[1] for arg in argv if arg.startswith("--gin_param=")]
    try:
        config_files.parse([str(gin_file)], params, search_path=REPO_ROOT)
        assert experiment.experiment().data_service == EXPECTED.split("=", 2)[2].strip("'")
    finally:
        import gin

        gin.clear_config()


def test_ctrl_c_while_deleting_names_what_is_not_deleted_yet(fake_gcloud):
    """The input VMs are deleted (first, quickly); Ctrl-C during the TPU's delete (minutes on Google Cloud): no
    traceback, and the TPU's delete command is printed."""
    fake_gcloud.write({"tpu_delete_seconds": 30}, [{"lines": 1, "exit": 0}])
    process = subprocess.Popen([sys.executable, SCRIPT, "--name=my-tpu", "--zone=us-central1-a", "--input_vms=1",
                                "--accelerator_type=v6e-1", "--version=v2-alpha-tpuv6e", *FAST, *TRAIN_ARGS],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **fake_gcloud.env})
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("+ gcloud compute tpus tpu-vm delete"):
            time.sleep(1)  # In the delete's subprocess.
            process.send_signal(signal.SIGINT)
            break
    output = "".join(lines) + process.stdout.read()
    process.wait(timeout=60)
    assert "Traceback" not in output and "+ gcloud compute instances delete my-tpu-input-0" in output, output
    assert ("Ctrl-C while deleting: what is not deleted yet is billed; delete it with `gcloud compute tpus tpu-vm "
            "delete my-tpu --zone=us-central1-a`.") in output, output
    assert _instances(fake_gcloud) == {}


def test_a_failed_delete_names_what_is_still_billed(fake_gcloud):
    result, verbs = fake_gcloud({"delete_fails": ["instances"]}, [{"lines": 1, "exit": 0}], "--input_vms=2")
    assert result.returncode == 0, result.stderr  # The job's code: it succeeded.
    assert verbs[-4:] == ["instances:delete", "instances:describe", "instances:describe", "tpu-vm:delete"]
    assert set(_instances(fake_gcloud)) == set(VMS)
    assert ("a delete failed (gcloud's message above): still billed until deleted with `gcloud compute instances "
            f"delete {' '.join(VMS)} --zone=us-central1-a`.") in result.stderr, result.stderr
    assert "tpus tpu-vm delete" not in result.stderr  # The TPU's delete went through.


def test_kept_input_vms_are_named_with_their_delete_command_and_a_skip_create_launch_restarts_their_services(
        fake_gcloud):
    result, verbs = fake_gcloud({}, [{"lines": 2, "exit": 0}], "--input_vms=2", "--keep")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not [verb for verb in verbs if verb.endswith(":delete")] and set(_instances(fake_gcloud)) == set(VMS)
    assert ("keeping my-tpu and its input VMs: check it with `gcloud compute tpus tpu-vm ssh my-tpu "
            "--zone=us-central1-a --worker=0`, delete with `gcloud compute instances delete "
            f"{' '.join(VMS)} --zone=us-central1-a` and `gcloud compute tpus tpu-vm delete my-tpu "
            "--zone=us-central1-a`; billed while they exist." in result.stdout), result.stdout
    first = {name: _service_pid(fake_gcloud, name) for name in VMS}
    assert all(map(_running, first.values()))  # Still serving, as the kept TPU could use them.
    again, verbs = fake_gcloud({}, [{"lines": 2, "exit": 0}], "--input_vms=2", "--skip_create", fresh=False)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert not [verb for verb in verbs if verb.endswith(":create")]
    for name in VMS:  # The old service stopped (SIGTERM, exit 0), a new one started with the new code.
        assert _gone(first[name]) and os.path.exists(_vm(fake_gcloud, name, "service-argv-1.json"))
    home = os.path.join(fake_gcloud.env["FAKE_GCLOUD_DIR"], "home")
    assert _data_service(_json(os.path.join(home, "argv-0.json"))) == [EXPECTED]
    assert verbs[-2:] == ["instances:delete", "tpu-vm:delete"] and _instances(fake_gcloud) == {}


def test_skip_create_with_more_input_vms_than_were_kept_says_so_before_sending_anything(fake_gcloud):
    kept, _ = fake_gcloud({}, [{"lines": 1, "exit": 0}], "--input_vms=2", "--keep")
    assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr[-3000:]
    again, verbs = fake_gcloud({}, [{"lines": 1, "exit": 0}], "--input_vms=3", "--skip_create", fresh=False)
    assert again.returncode == 1 and "the internal IP of my-tpu-input-2 is unknown" in again.stderr, again.stderr
    assert "give the --input_vms of the --keep launch that made them, or drop --skip_create" in again.stderr
    assert not [verb for verb in verbs if verb.endswith(":scp")]  # Nothing sent.
    assert _instances(fake_gcloud) == {}  # The two kept VMs deleted with the TPU (the third never existed).


def test_the_cpu_vms_tensorflow_is_the_tpus():
    """The TPU's client and the CPU VMs' tf.data workers speak the service's protocol: one TensorFlow version."""
    assert pinned_tensorflow("requirements.txt", "tensorflow-cpu") == pinned_tensorflow("requirements-tpu.txt",
                                                                                       "tensorflow-tpu")
