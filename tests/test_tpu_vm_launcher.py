"""scripts/tpu_vm.py: the Cloud TPU VM launcher, checked without a cloud.

Dry runs show the gcloud commands. Everything else runs the real script against tests/fake_gcloud.py, a stand-in
`gcloud` on PATH (Google Cloud cannot be reached from here) that RUNS the launcher's job commands (start, poll,
stop) in a local bash standing in for worker 0, with a fake train.py: so the detached job, the log offsets, the
SSH drops, preemption, queued resources and capacity errors are exercised as real processes and shell commands.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from tests.helpers import REPO_ROOT
from tests.tpu_vm_runs import FAST, SCRIPT, TRAIN_ARGS
from tests.tpu_vm_runs import commands as _commands
from tests.tpu_vm_runs import job_script as _job_script
from tests.tpu_vm_runs import launch as _launch


def test_dry_run_for_a_pod_installs_everywhere_and_trains_detached_on_worker_0():
    result = _launch("--accelerator_type=v3-32", "--version=tpu-vm-tf-2.20.0-pod", "--dry_run", *TRAIN_ARGS)
    assert result.returncode == 0, result.stderr
    commands = _commands(result.stdout)
    assert commands[0].startswith("gcloud compute tpus tpu-vm create my-tpu --zone us-central1-a "
                                  "--accelerator-type=v3-32 --version=tpu-vm-tf-2.20.0-pod")
    install = next(command for command in commands if "pip install" in command)
    assert "--worker=all" in install and "requirements-tpu.txt" in install and "python3.11 -m venv" in install
    start = next(command for command in commands if "setsid nohup" in command)
    assert "--worker=0" in start and "setsid nohup bash job/0.sh > job/0.log" in start
    assert "| base64 -d > job/0.sh" in start and "train.py" not in start  # Only base64 reaches the remote shell.
    script = _job_script(result.stdout)
    assert "export TPU_LOAD_LIBRARY=0" in script and 'TPU="my-tpu"' in script and "us-central1-a" in script
    assert ".venv/bin/python train.py --gin_file=configs/tpu/cifar10_resnet_v3_32_pod.gin" in script
    assert "pod slice, classic TPU runtime" in result.stdout
    assert commands[-1] == "gcloud compute tpus tpu-vm delete my-tpu --zone us-central1-a --quiet"


def test_pjrt_is_decided_by_the_generation_not_the_version_string():
    result = _launch("--accelerator_type=v5litepod-8", "--version=v2-alpha-tpuv5-lite", "--spot", "--dry_run",
                     *TRAIN_ARGS)
    assert result.returncode == 0, result.stderr
    assert "v5e (v5litepod-8), 8 chip(s), 8 replica(s), single host, PJRT pluggable device" in result.stdout
    script = _job_script(result.stdout)
    assert "export TPU_ACCELERATOR_TYPE=v5litepod-8" in script and 'TPU="local"' in script
    assert "TPU_LOAD_LIBRARY" not in script and "--spot" in _commands(result.stdout)[0]
    classic = _launch("--accelerator_type=v4-8", "--version=tpu-vm-tf-2.18.0-pjrt", "--dry_run", *TRAIN_ARGS)
    assert "v4 (v4-8), 4 chip(s), 4 replica(s), single host, classic TPU runtime" in classic.stdout


def test_bad_flags_stop_before_anything_is_created():
    result = _launch("--accelerator_type=v3_8", "--version=x", "--dry_run", *TRAIN_ARGS)
    assert result.returncode == 2 and "--accelerator_type='v3_8'" in result.stderr
    assert not _commands(result.stdout)


@pytest.mark.parametrize("flag", ["--name=--impersonate-service-account=x@y.iam", "--name=my-tpu;touch x",
                                  "--name=My_TPU", '--zone=us-central1-a"\nFOO=1', "--zone=--project=other",
                                  "--project=--verbosity=debug", "--project=a b", "--version=x y", "--version=-x",
                                  "--tpu_server_image=gcr.io/p/i:2.20 && touch x", "--tpu_server_image=ｇcr.io/p"])
def test_flags_that_become_parts_of_gcloud_commands_are_checked_first(flag):
    """A value that could pass as another gcloud option, or as shell or gin text (--zone and --name go into gin
    strings), stops the launch before any command; the later flag wins over the fixture's --name and --zone."""
    result = _launch("--accelerator_type=v4-8", "--version=tpu-vm-tf-2.18.0-pjrt", flag, "--dry_run", *TRAIN_ARGS)
    name = flag.split("=", 1)[0]
    assert result.returncode == 2 and result.stderr.startswith(f"error: {name}="), result.stdout + result.stderr
    assert "expected" in result.stderr and not _commands(result.stdout)
    good = _launch("--accelerator_type=v4-8", "--version=tpu-vm-tf-2.18.0-pjrt", "--project=my-project-123",
                   "--zone=europe-west4-a", "--dry_run", *TRAIN_ARGS)
    assert good.returncode == 0, good.stderr


def test_train_arguments_too_long_for_one_ssh_command_stop_before_anything_is_created(fake_gcloud):
    """One command-line argument is at most 128 KiB on Linux (the ssh command, here and on the VM): the launch
    stops at once with the fix instead of failing after the TPU was created."""
    settings = [f"--gin_param=X{index}='{'y' * 15000}'" for index in range(8)]
    result, verbs = fake_gcloud({}, [], train_args=["--", *settings])
    assert result.returncode == 2 and "one SSH command carries: put the settings in a gin file" in result.stderr
    assert not verbs


def test_a_pod_whose_runtime_tensorflow_differs_is_refused_naming_both_versions():
    result = _launch("--accelerator_type=v5litepod-16", "--version=tpu-vm-tf-2.18.0-pod-pjrt", "--dry_run",
                     *TRAIN_ARGS)
    assert result.returncode == 2 and not _commands(result.stdout)
    assert "runs TensorFlow 2.18" in result.stderr and "tensorflow-tpu 2.20.0" in result.stderr
    assert "--tpu_server_image=" in result.stderr  # The fix.
    generic = _launch("--accelerator_type=v3-32", "--version=v2-alpha-tpuv5", "--dry_run", *TRAIN_ARGS)
    assert generic.returncode == 2 and "not a TensorFlow pod runtime" in generic.stderr
    aligned = _launch("--accelerator_type=v5litepod-16", "--version=tpu-vm-tf-2.18.0-pod-pjrt", "--dry_run",
                      "--tpu_server_image=gcr.io/my-project/tpu-server:2.20", *TRAIN_ARGS)
    assert aligned.returncode == 0, aligned.stderr
    align = next(command for command in _commands(aligned.stdout) if "tpu-runtime.service" in command)
    assert "--worker=all" in align and "TF_DOCKER_URL=gcr.io/my-project/tpu-server:2.20" in align


def _steps(stdout: str, attempt: int) -> list[int]:
    return [int(line.split()[3]) for line in stdout.splitlines() if line.startswith(f"attempt {attempt} step ")]


def _compact(verbs: list[str]) -> list[str]:
    """Consecutive job SSH commands (start, polls) folded into one 'ssh...' entry."""
    folded = []
    for verb in verbs:
        if not (verb == "tpu-vm:ssh" and folded and folded[-1] == "ssh..."):
            folded.append("ssh..." if verb == "tpu-vm:ssh" else verb)
    return folded


def test_the_job_runs_detached_its_whole_log_is_streamed_then_the_tpu_is_deleted(fake_gcloud):
    result, verbs = fake_gcloud({}, [{"lines": 30, "exit": 0}])
    assert result.returncode == 0, result.stdout + result.stderr
    assert _steps(result.stdout, 0) == list(range(30))  # Every line once, in order.
    assert "TPU_ACCELERATOR_TYPE=v5litepod-8" in result.stdout  # Seen by train.py on the worker.
    assert _compact(verbs) == ["tpu-vm:create", "tpu-vm:scp", "ssh...", "tpu-vm:delete"]
    # The copied archive is this launch's own temporary file (not a fixed path another launch would overwrite),
    # deleted once copied.
    temp_dir = fake_gcloud.env["TMPDIR"]
    calls = [json.loads(line) for line in open(os.path.join(temp_dir, "calls.jsonl"))]
    (archive,) = [call[4] for call in calls if call[:4] == ["compute", "tpus", "tpu-vm", "scp"]]
    assert os.path.dirname(archive) == temp_dir and archive.endswith(".tgz")
    assert os.path.basename(archive) != "tpu-template.tgz" and not os.path.exists(archive)
    assert not [name for name in os.listdir(temp_dir) if name.endswith(".tgz")]


def test_an_ssh_drop_mid_run_keeps_the_tpu_and_the_log_resumes(fake_gcloud):
    # Job commands 1 = start, 2.. = polls: polls 3, 4 and 5 drop while the job runs on.
    result, verbs = fake_gcloud({"ssh_drops": [3, 4, 5]}, [{"lines": 60, "seconds": 0.02, "exit": 0}])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SSH to worker 0 failed (exit 255); the job is left running") == 3
    assert "reconnected; the log continues from byte" in result.stdout
    assert _steps(result.stdout, 0) == list(range(60))
    assert verbs.count("tpu-vm:delete") == 1 and verbs[-1] == "tpu-vm:delete"
    assert "tpu-vm:create" not in verbs[1:]  # Not recreated, not restarted: the same job throughout.


def test_a_worker_that_stays_unreachable_keeps_the_tpu(fake_gcloud):
    result, verbs = fake_gcloud({"ssh_drops": list(range(2, 50))}, [{"lines": 400, "seconds": 0.02, "exit": 0}],
                                "--ssh_retries=2")
    assert result.returncode == 1
    assert "tpu-vm:delete" not in verbs and "keeping my-tpu (the job may still be running)" in result.stdout
    assert "gcloud compute tpus tpu-vm delete my-tpu --zone=us-central1-a" in result.stdout


def test_a_failure_is_not_rerun_and_the_tpu_is_deleted(fake_gcloud):
    result, verbs = fake_gcloud({}, [{"lines": 3, "exit": 4}], "--max_restarts=2")
    assert result.returncode == 4 and "a failure a rerun would repeat" in result.stdout
    assert _compact(verbs) == ["tpu-vm:create", "tpu-vm:scp", "ssh...", "tpu-vm:describe", "tpu-vm:delete"]


@pytest.mark.parametrize("interruption", [3, "sigterm"])
def test_an_interruption_is_resumed_then_the_tpu_is_deleted(fake_gcloud, interruption):
    result, verbs = fake_gcloud({}, [{"lines": 3, "exit": interruption}, {"lines": 2, "exit": 0}], "--max_restarts=1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"exited with {3 if interruption == 3 else 143}" in result.stdout and "restart 1 of 1" in result.stdout
    assert _steps(result.stdout, 1) == [0, 1]
    assert _compact(verbs) == ["tpu-vm:create", "tpu-vm:scp", "ssh...", "tpu-vm:describe", "ssh...",
                               "tpu-vm:delete"]


def test_a_storage_failure_is_rerun_and_a_crash_is_not(fake_gcloud):
    """train.py exits 6 when the storage failed (the rerun resumes once it answers) and 1 for a bug: only the first
    is worth a restart."""
    result, verbs = fake_gcloud({}, [{"lines": 3, "exit": 6}, {"lines": 2, "exit": 0}], "--max_restarts=1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "exited with 6" in result.stdout and "restart 1 of 1" in result.stdout
    crash, _ = fake_gcloud({}, [{"lines": 3, "exit": 1}, {"lines": 2, "exit": 0}], "--max_restarts=1")
    assert crash.returncode == 1 and "a failure a rerun would repeat; not restarting" in crash.stdout


def test_restarts_used_up_end_with_the_interruption_code(fake_gcloud):
    result, verbs = fake_gcloud({}, [{"lines": 1, "exit": 3}, {"lines": 1, "exit": 3}], "--max_restarts=1")
    assert result.returncode == 3 and "no restarts left (--max_restarts=1)" in result.stdout
    assert verbs[-1] == "tpu-vm:delete"


def test_a_preempted_tpu_is_recreated_and_the_job_resumed(fake_gcloud):
    result, verbs = fake_gcloud({"preempt_at": [4]}, [{"lines": 200, "seconds": 0.02, "exit": 0},
                                                      {"lines": 2, "exit": 0}], "--max_restarts=1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(TPU PREEMPTED): resuming, restart 1 of 1" in result.stdout
    assert _compact(verbs) == ["tpu-vm:create", "tpu-vm:scp", "ssh...", "tpu-vm:describe", "tpu-vm:delete",
                               "tpu-vm:create", "tpu-vm:scp", "ssh...", "tpu-vm:delete"]


def test_queued_resources_wait_with_progress_and_are_deleted(fake_gcloud):
    scenario = {"queued_states": ["ACCEPTED", "WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "PROVISIONING"]}
    result, verbs = fake_gcloud(scenario, [{"lines": 2, "exit": 0}], "--queued", "--spot")
    assert result.returncode == 0, result.stdout + result.stderr
    progress = [line for line in result.stdout.splitlines() if line.startswith("[tpu_vm] queued resource my-tpu:")]
    assert [line.split(": ")[1].split(" (")[0] for line in progress] == [
        "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    create = next(command for command in _commands(result.stdout) if "queued-resources create" in command)
    assert "--node-id=my-tpu" in create and "--runtime-version=v2-alpha-tpuv5-lite" in create and "--spot" in create
    assert verbs[0] == "queued-resources:create" and verbs[-1] == "queued-resources:delete"
    assert "gcloud compute tpus queued-resources delete my-tpu --zone us-central1-a --force --quiet" in result.stdout


def test_a_capacity_error_is_retried_with_back_off(fake_gcloud):
    error = "ERROR: (gcloud.compute.tpus.tpu-vm.create) RESOURCE_EXHAUSTED: There is no more capacity in the zone"
    result, verbs = fake_gcloud({"create_errors": [error, error]}, [{"lines": 1, "exit": 0}])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "retry 1 of 5 in 0.01 s" in result.stdout and "retry 2 of 5 in 0.02 s" in result.stdout
    assert verbs[:3] == ["tpu-vm:create"] * 3
    exhausted, verbs = fake_gcloud({"create_errors": [error] * 3}, [], "--capacity_retries=1")
    assert exhausted.returncode == 1
    assert "no capacity for v5litepod-8 in us-central1-a after 2 tries" in exhausted.stderr
    other, verbs = fake_gcloud({"create_errors": ["ERROR: PERMISSION_DENIED"]}, [])
    assert other.returncode == 1 and "retry" not in other.stdout  # Not a capacity error: not retried.


def test_ctrl_c_stops_the_job_and_deletes_the_tpu_only_once_it_has_stopped(fake_gcloud):
    fake_gcloud.write({}, [{"lines": 2000, "seconds": 0.02, "exit": 0}])
    process = subprocess.Popen([sys.executable, SCRIPT, "--name=my-tpu", "--zone=us-central1-a",
                                "--accelerator_type=v6e-1", "--version=v2-alpha-tpuv6e", *FAST, *TRAIN_ARGS],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **fake_gcloud.env})
    lines = []
    for line in process.stdout:  # Wait until the job is training, then press Ctrl-C.
        lines.append(line)
        if line.startswith("attempt 0 step 5 "):
            process.send_signal(signal.SIGINT)
            break
    started = time.monotonic()
    output = "".join(lines) + process.stdout.read()  # Not communicate(timeout=...): it would skip read-ahead lines.
    process.wait(timeout=60)
    assert process.returncode == 3, output
    assert time.monotonic() - started < 30
    steps = _steps(output, 0)
    assert steps == list(range(len(steps))) and len(steps) >= 6  # Streamed on while stopping, no line twice.
    stopped = output.index("SIGTERM: checkpoint saved at the last loop")  # The job's own log, streamed.
    assert output.index("the job exited with 3") > stopped
    assert fake_gcloud.verbs()[-1] == "tpu-vm:delete"


# Arguments a user (or a config generated by someone else) might pass, each of which a shell would act on if the job
# were shell text built from them. MARKER is replaced by a file path: an injected command would create that file.
HOSTILE_ARGUMENTS = {
    "shell syntax": ["a; touch MARKER", "$(touch MARKER)", "`touch MARKER`", "x && touch MARKER", "| touch MARKER",
                     "> MARKER", "${IFS}touch${IFS}MARKER", "$HOME", "*", "~", "!!", "#", "", " ", "\t", "\r", "-"],
    "heredoc terminator": ["--gin_param=A=1\nEND_OF_TPU_VM_JOB\ntouch MARKER\n", "\nEND_OF_TPU_VM_JOB",
                           "END_OF_TPU_VM_JOB", "\n"],
    "quotes and backslashes": ["it's", "'", "\"", "'\"'\"'", "\\", "a\\", "\\'; touch MARKER; '",
                               "--gin_param=NAME='x'\"y\"", "$'\\x41'"],
    "unicode, control and non-UTF-8 bytes": ["ünïcødé ✓ 日本語 🙂", "\x01\x02\x1b[31m\x7f",
                                              b"\xff\xfe\x80 bytes".decode("utf-8", "surrogateescape")],
    "long": ["--gin_param=X='" + "y" * 20000 + "'"],
}


@pytest.mark.parametrize("kind", HOSTILE_ARGUMENTS)
def test_train_py_receives_exactly_the_given_arguments_and_nothing_is_run(fake_gcloud, tmp_path, kind):
    """The job's script reaches worker 0 in a form no argument can end or alter; train.py (the stand-in on the fake
    worker, which runs the very commands a TPU VM would) records the arguments it got."""
    marker = str(tmp_path / "injected")
    hostile = [argument.replace("MARKER", marker) for argument in HOSTILE_ARGUMENTS[kind]]
    result, _ = fake_gcloud({}, [{"lines": 1, "exit": 0}], train_args=["--", *hostile])
    assert not os.path.exists(marker), f"an argument ran a command: {result.stdout[-3000:]}"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(tmp_path / "home" / "argv-0.json") as handle:
        received = json.load(handle)
    assert received[0] == "train.py" and received[1:len(hostile) + 1] == hostile
    assert received[len(hostile) + 1:] == ['--gin_param=experiment.tpu_zone="us-central1-a"', '--gin_param=TPU="local"']


def _git(root, *args: str) -> list[str]:
    result = subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True)
    return [path for path in result.stdout.split("\0") if path]


def test_only_what_git_tracks_reaches_the_workers(fake_gcloud, tmp_path):
    """A copy of this checkout with the secrets and folders a real one gathers: the archive the workers receive
    holds exactly the tracked files (a tracked data/runs/keep.py included) and the one --include names."""
    copy = tmp_path / "checkout"
    for path in _git(REPO_ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"):
        if os.path.isfile(os.path.join(REPO_ROOT, path)):
            os.makedirs(copy / os.path.dirname(path), exist_ok=True)
            shutil.copy2(os.path.join(REPO_ROOT, path), copy / path)
    _git(copy, "init", "-q")
    _git(copy, "add", "-A")
    for path, text in {"data/runs/keep.py": "KEEP = 1\n", "notes/extra.gin": "EXTRA = 1\n"}.items():
        os.makedirs(copy / os.path.dirname(path), exist_ok=True)
        (copy / path).write_text(text)
    _git(copy, "add", "-f", "data/runs/keep.py")  # `runs/` is ignored; tracked anyway, so sent.
    secrets = [".env", "key.json", ".ssh/id_rsa", "deploy.pem", "venv2/pyvenv.cfg", "venv2/bin/python",
               ".venv/bin/python", "tensorflow_datasets/digits/1.0.0/train.tfrecord", "runs/r1/ckpt-1.index",
               "models/__pycache__/cnn.cpython-311.pyc"]
    for path in secrets:
        os.makedirs(copy / os.path.dirname(path), exist_ok=True)
        (copy / path).write_text("secret")
    tracked = _git(copy, "ls-files", "-z")
    untracked = set(_git(copy, "ls-files", "-z", "--others", "--exclude-standard")) - {"notes/extra.gin"}
    result, _ = fake_gcloud({}, [{"lines": 1, "exit": 0}], "--include=notes/extra.gin",
                            script=str(copy / "scripts" / "tpu_vm.py"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with tarfile.open(tmp_path / "home" / "tpu-template.tgz") as archive:
        sent = archive.getnames()
    assert sorted(sent) == sorted([*tracked, "notes/extra.gin"]) and "data/runs/keep.py" in sent
    assert not set(secrets) & set(sent)
    assert f"sending {len(tracked) + 1} files (" in result.stdout
    assert f"not sent: {len(untracked)} untracked" in result.stdout


def test_a_copy_that_is_not_a_git_checkout_is_refused_before_anything_is_created(fake_gcloud, tmp_path):
    copy = tmp_path / "download"
    shutil.copytree(REPO_ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", ".*cache"))
    result, verbs = fake_gcloud({}, [], script=str(copy / "scripts" / "tpu_vm.py"),
                                extra_env={"GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert result.returncode == 2 and "is not a git checkout" in result.stderr and not verbs


def test_the_job_commands_refuse_values_that_would_be_shell_text():
    """The launcher's own values (folder, attempt, offset, environment names) are never quoted: they are checked."""
    from scripts.remote_job import poll_command, start_command, stop_command

    assert "base64 -d" in start_command("tpu-template", 0, {"TPU_LOAD_LIBRARY": "0"}, ["train.py"])
    for bad in (lambda: start_command("x; touch y", 0, {}, ["train.py"]),
                lambda: start_command("tpu-template", 0, {"A=1 touch": "y"}, ["train.py"]),
                lambda: poll_command("tpu-template", "0; touch y", 0), lambda: poll_command("..", 0, 0),
                lambda: poll_command("tpu-template", 0, "1; touch y"), lambda: stop_command("$(touch y)", 0)):
        with pytest.raises(ValueError, match="expected"):
            bad()
