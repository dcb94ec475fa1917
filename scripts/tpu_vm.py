"""Train on a Cloud TPU VM from your machine: create it, install, train detached, stream the log, delete it.

  python scripts/tpu_vm.py --name=my-tpu --zone=us-central2-b --accelerator_type=v4-8 --version=tpu-vm-tf-2.x.y \\
      -- --gin_file=configs/tpu/cifar10_resnet_v4_8.gin --model_dir=gs://BUCKET/runs/c10
  python scripts/tpu_vm.py ... --queued --spot      # wait in Google's queue for (spot) capacity
  python scripts/tpu_vm.py ... --dry_run            # print the gcloud commands, run nothing

Steps (`gcloud compute tpus ...` commands; `gcloud compute instances|ssh|scp` for the input VMs):
 1. create the TPU VM (`--version` is the TPU software version: no TF 2.20 image name is documented, so it is a
    parameter), or with `--queued` a queued resource, waiting with progress lines until it is ACTIVE. Capacity
    errors (RESOURCE_EXHAUSTED, "no more capacity", quota) are retried with back-off, `--capacity_retries` times.
    `--input_vms=N`: once the TPU exists, N CPU VMs for the tf.data service (scripts/input_vms.py) get the same
    files and requirements.txt, each runs `python -m data.service`, and train.py gets their DATA_SERVICE;
 2. copy the files git tracks (as they are here, uncommitted changes included) and those `--include=PATH` names to
    every worker, never an untracked file (`.env`, keys, other virtualenvs, datasets); the count, the size and the
    untracked files left behind are printed first, and a folder that is not a git checkout is refused (exit 2)
    (scripts/source_archive.py). Then install requirements-tpu.txt in a Python 3.11 virtualenv there;
 3. start `train.py ARGS` detached on worker 0 (`setsid nohup`, log and pid in ~/tpu-template/job/) and poll its
    log over SSH. A dropped SSH connection is retried: the job keeps running and the log resumes where it stopped.
    The job's script is printed, then sent base64-encoded with every argument quoted inside it, so no argument
    (newlines, quotes, `$(...)`, non-UTF-8 bytes) is shell text on the VM; the flags that become parts of gcloud
    commands are checked against what Google Cloud accepts before anything runs (exit 2).
    PJRT (v5e, v5p, v6e) or the classic runtime is decided from the accelerator type by the same start-up code as
    train.py's (tpu_utils/tpu/startup.py). Pod slices are driven by TensorFlow's single client on worker 0
    (`TPU=<name>`, `TPU_LOAD_LIBRARY=0`); their TPU runtime must be a `-pod` runtime of the same TensorFlow as
    requirements-tpu.txt, or `--tpu_server_image` realigns every host's TPU server; otherwise nothing is created;
 4. with `--max_restarts N`, every interruption it can recognise is resumed from the checkpoint: exit 3 (train.py
    stopped by SIGTERM), exit 6 (train.py stopped by a storage failure), death by SIGTERM (143), a job that vanished
    without an exit code, a preempted or deleted TPU (recreated and reinstalled first); a stopped service is restarted;
 5. delete the TPU only when the job has ended (done, failed, or restarts used up), or on Ctrl-C once the job has
    confirmed it stopped (SIGTERM: it checkpoints and exits 3). A TPU whose job may still be running is kept, with
    the command to delete it. `--keep` always keeps it. The input VMs are deleted and kept with it.
The exit code is the training command's (0 done, 2 config error, 3 interrupted, 4 non-finite loss, 6 storage
failed), 1 if the launch itself failed, 2 for bad launcher flags.
"""

import codecs
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # Run as a script from anywhere.

from common.errors import EXIT_CONFIG_ERROR, EXIT_INTERRUPTED, EXIT_STORAGE_FAILED  # noqa: E402
from scripts.gcloud import Gcloud, LauncherError, flag_problem  # noqa: E402
from scripts.input_vms import InputVms, input_problem  # noqa: E402
from scripts.launcher_flags import parse_args  # noqa: E402
from scripts.pod_runtime import ALIGN_TPU_SERVER, TPU_RUNTIME_UNIT, pinned_tensorflow, pod_runtime_problem
from scripts.remote_job import job_script, parse_poll, poll_command, start_command, started_pid, stop_command
from scripts.source_archive import INSTALL, REMOTE_DIR, select, write_archive  # noqa: E402
from tpu_utils.tpu.facts import RuntimeFacts  # noqa: E402
from tpu_utils.tpu.generations import parse_accelerator_type  # noqa: E402
from tpu_utils.tpu.startup import PJRT_ENV, decide  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Rerun: train.py's SIGTERM exit (3), storage failure (6), death by SIGTERM (143, -15); not 1 (a bug), 2 (bad input).
RETRYABLE_EXIT_CODES = (EXIT_INTERRUPTED, EXIT_STORAGE_FAILED, 143, -15)
GONE_STATES = ("PREEMPTED", "TERMINATED", "NOT_FOUND")


def install(gcloud: Gcloud, args, pod: bool, files, inputs: InputVms | None = None) -> None:
    """Copies `files` (scripts/source_archive.py: what git tracks, plus --include) to every worker (and the input
    VMs) and installs the requirements there."""
    # A fresh archive per launch: two launches at once (or another user's) must not share or overwrite one file.
    handle, archive = tempfile.mkstemp(prefix=f"{REMOTE_DIR}-", suffix=".tgz")
    os.close(handle)
    try:
        if not args.dry_run:
            size = write_archive(files, archive)
            print(f"[tpu_vm] archive of the {len(files.paths)} files: {size / 1e6:.1f} MB", flush=True)
        gcloud.run("gcloud", "compute", "tpus", "tpu-vm", "scp", archive, f"{args.name}:~/{REMOTE_DIR}.tgz",
                   *gcloud.base, "--worker=all")
        if inputs:
            inputs.send(archive)
    finally:
        os.remove(archive)
    gcloud.ssh(INSTALL.format(requirements="requirements-tpu.txt"), worker="all")
    if inputs:
        inputs.install()
    if pod and args.tpu_server_image:
        gcloud.ssh(ALIGN_TPU_SERVER.format(image=args.tpu_server_image, unit=TPU_RUNTIME_UNIT), worker="all")


def train_command(args, decision, data_service: str | None = None) -> tuple[dict, list[str]]:
    """(environment, argv) of train.py on worker 0. train.py's start-up sets PJRT from TPU_ACCELERATOR_TYPE
    with the VM's libtpu path; pods also get TPU_LOAD_LIBRARY=0 from the same decision."""
    train_args = [*args.train_args, f'--gin_param=experiment.tpu_zone="{args.zone}"']  # Bucket region check.
    train_args.append(f'--gin_param=TPU="{args.name}"' if decision.pod else '--gin_param=TPU="local"')
    # The input VMs' services, bound to the field itself: it wins over a gin file's binding of the field or the macro.
    train_args += [f"--gin_param=experiment.data_service='{data_service}'"] if data_service else []
    environment = {"TPU_ACCELERATOR_TYPE": args.accelerator_type,
                   **{key: value for key, value in decision.env.items() if key not in PJRT_ENV}}
    return environment, [".venv/bin/python", "train.py", *train_args]


def follow(gcloud: Gcloud, args, state: dict, deadline: float | None = None) -> tuple[int | None, str]:
    """Streams the log of job state['attempt'] from byte state['offset'] until the job ends: (exit code, 'exited'),
    or (None, 'vanished' | 'unreachable' | 'timeout'). SSH failures are retried with back-off; the job is never
    touched by them. state['offset'] advances with what was shown, so a later call continues without repeats."""
    attempt, failures, dead_polls = state["attempt"], 0, 0
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        offset = state["offset"]
        result = gcloud.ssh(poll_command(REMOTE_DIR, attempt, offset), check=False, capture=True, quiet=True,
                            text=False)
        poll = parse_poll(result.stdout or b"", offset) if result.returncode == 0 else None
        if poll is None:
            failures += 1
            if failures > args.ssh_retries:
                return None, "unreachable"
            wait = min(args.poll_seconds * 2 ** failures, 120)
            print(f"\n[tpu_vm] SSH to worker 0 failed (exit {result.returncode}); the job is left running. "
                  f"Reconnecting in {wait:g} s ({failures} of {args.ssh_retries}).", flush=True)
            gcloud.sleep(wait)
            continue
        if failures:
            print(f"[tpu_vm] reconnected; the log continues from byte {offset}.", flush=True)
            failures = 0
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # Ctrl-C after, not while, showing a chunk:
        try:  # otherwise the log could show a chunk twice or skip it.
            sys.stdout.write(decoder.decode(poll.chunk))
            sys.stdout.flush()
            state["offset"] = offset + len(poll.chunk)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if poll.exit_code is not None:
            return poll.exit_code, "exited"
        dead_polls = 0 if poll.alive else dead_polls + 1
        if dead_polls >= 2:  # Twice: the wrapper may be between train.py's exit and writing the code.
            return None, "vanished"
        if deadline is not None and time.monotonic() > deadline:
            return None, "timeout"
        gcloud.sleep(args.poll_seconds)


def stop_job(gcloud: Gcloud, args, state: dict) -> bool:
    """SIGTERM to the job, then follow it until it has ended; True once it has (confirmed by its exit code)."""
    print(f"\n[tpu_vm] Ctrl-C: stopping the job (SIGTERM: it saves a checkpoint and exits {EXIT_INTERRUPTED}); "
          f"waiting up to {args.stop_timeout:g} s. Ctrl-C again to stop waiting and keep the TPU.", flush=True)
    gcloud.ssh(stop_command(REMOTE_DIR, state["attempt"]), check=False, capture=True)
    code, how = follow(gcloud, args, state, deadline=time.monotonic() + args.stop_timeout)
    print(f"[tpu_vm] the job {'exited with ' + str(code) if how == 'exited' else how}.", flush=True)
    return how in ("exited", "vanished")


def run_jobs(gcloud: Gcloud, args, decision, state: dict, files, inputs: InputVms) -> int:
    """Starts the job and restarts it after recognised interruptions; returns the final exit code."""
    environment, command = train_command(args, decision, inputs.data_service())
    script = job_script(0, environment, command).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    print(f"[tpu_vm] the job's script (~/{REMOTE_DIR}/job/0.sh on worker 0, N.sh after N restarts; sent base64-"
          "encoded, every argument quoted):\n" + "".join(f"    {line}\n" for line in script.splitlines()), end="")
    for attempt in range(args.max_restarts + 1):
        state["attempt"], state["offset"] = attempt, 0
        state["job_may_run"] = True  # From here on, a failure must not delete the TPU under a running job.
        started = gcloud.ssh(start_command(REMOTE_DIR, attempt, environment, command), check=False, capture=True)
        if args.dry_run:
            print("+ (then polls) " + poll_command(REMOTE_DIR, attempt, 0), flush=True)
            return 0
        pid = started_pid(started.stdout or "")
        if pid is not None:
            print(f"[tpu_vm] job {attempt} started on worker 0 (pid {pid}); log ~/{REMOTE_DIR}/job/{attempt}.log",
                  flush=True)
        elif started.returncode == 255:  # SSH dropped: the job may or may not have started; the polls will tell.
            print(f"[tpu_vm] SSH dropped while starting job {attempt}; checking whether it runs.", flush=True)
        else:
            state["job_may_run"] = False
            raise LauncherError(f"the job did not start on worker 0 (exit {started.returncode}): "
                                f"{((started.stdout or '') + (started.stderr or ''))[-500:]}")
        code, how = follow(gcloud, args, state)
        if code == 0:
            state["job_may_run"] = False
            return 0
        tpu_state = gcloud.state()
        gone = tpu_state in GONE_STATES
        if how == "unreachable" and not gone:
            raise LauncherError(f"worker 0 did not answer {args.ssh_retries} SSH polls and the TPU is "
                                f"{tpu_state or 'in an unknown state'}: the job may still be running.")
        state["job_may_run"] = False
        what = f"exited with {code}" if how == "exited" else f"{how} (no exit code)"
        retryable = code in RETRYABLE_EXIT_CODES or how != "exited" or gone
        dead = inputs.dead() if code == 1 else []  # train.py's exit 1 when a service died: a rerun resumes.
        if dead:
            print(f"[tpu_vm] the job {what}: the tf.data service on {', '.join(dead)} is not running.", flush=True)
        retryable = retryable or bool(dead)
        if not retryable:
            print(f"[tpu_vm] the job {what}: a failure a rerun would repeat; not restarting.", flush=True)
            return code
        if attempt == args.max_restarts:
            print(f"[tpu_vm] the job {what} (TPU {tpu_state or 'state unknown'}); no restarts left "
                  f"(--max_restarts={args.max_restarts}).", flush=True)
            return code if code is not None else EXIT_INTERRUPTED
        print(f"[tpu_vm] the job {what} (TPU {tpu_state or 'state unknown'}): resuming, restart {attempt + 1} of "
              f"{args.max_restarts}.", flush=True)
        if gone:
            gcloud.delete()
            gcloud.create()
            install(gcloud, args, decision.pod, files)
        inputs.restart_dead(dead or None)
    return EXIT_INTERRUPTED


def clean_up(gcloud: Gcloud, inputs: InputVms, args, keep_reason: str | None) -> None:
    """Deletes the input VMs and the TPU, or says how to: when they are kept, when a delete fails, and on Ctrl-C
    while deleting. Nothing is left billed without its delete command printed."""
    deletes = ([(inputs.delete, inputs.delete_command())] if inputs.exist else []) + [
        (gcloud.delete, gcloud.delete_command())]
    how = " and ".join(f"`{command}`" for _, command in deletes)
    if args.keep or keep_reason:
        print(f"[tpu_vm] keeping {args.name}{' and its input VMs' if inputs.exist else ''}"
              f"{' (' + keep_reason + ')' if keep_reason else ''}: check it with `gcloud compute tpus tpu-vm ssh "
              f"{args.name} --zone={args.zone}{gcloud.project_flag} --worker=0`, delete with {how}; billed while "
              "they exist.", flush=True)
        return
    left = []
    for index, (delete, command) in enumerate(deletes):  # The VMs first: their delete is quick.
        try:
            left += [] if delete() else [command]
        except KeyboardInterrupt:
            pending = " and ".join(f"`{command}`" for command in left + [command for _, command in deletes[index:]])
            print(f"\n[tpu_vm] Ctrl-C while deleting: what is not deleted yet is billed; delete it with {pending}.",
                  file=sys.stderr, flush=True)
            return
    if left:
        print(f"[tpu_vm] a delete failed (gcloud's message above): still billed until deleted with "
              f"{' and '.join(f'`{command}`' for command in left)}.", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    args = parse_args(argv, __doc__)
    # Ctrl-C (or `kill -INT`) stops the job cleanly even when started from a background shell, which ignores SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        parse_accelerator_type(args.accelerator_type)
    except ValueError as error:
        print(f"error: --accelerator_type={args.accelerator_type!r}: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    decision = decide(RuntimeFacts(accelerator_type=args.accelerator_type, accelerator_type_source="--accelerator_type",
                                   libtpu_path="<the VM's site-packages>/libtpu/libtpu.so"))
    problem = flag_problem(args) or input_problem(args, pod=decision.pod) or (decision.pod and pod_runtime_problem(
        args.accelerator_type, args.version, pinned_tensorflow(), args.tpu_server_image))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(f"[tpu_vm] {decision.summary()} (set on the VM by train.py's start-up)", flush=True)
    gcloud, state, code, keep_reason = Gcloud(args), {"job_may_run": False, "attempt": 0, "offset": 0}, 1, None
    inputs = InputVms(gcloud, args)
    try:  # A command too long for SSH: ValueError.
        start_command(REMOTE_DIR, args.max_restarts, *train_command(args, decision, inputs.data_service()))
        files = select(REPO_ROOT, args.include)  # Not a git checkout, or a bad --include: SourceError.
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(f"[tpu_vm] {files.summary()}", flush=True)
    try:
        if not args.skip_create:
            gcloud.create()
            inputs.create()  # Once the TPU exists: its capacity is the scarce part.
        elif inputs.names:
            inputs.learn_ips()  # They exist (a --keep launch made them): checked before anything is sent.
        install(gcloud, args, decision.pod, files, inputs)
        inputs.start_all()
        code = run_jobs(gcloud, args, decision, state, files, inputs)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
        if state["job_may_run"]:
            try:
                stopped = stop_job(gcloud, args, state)
            except KeyboardInterrupt:
                stopped = False
            keep_reason = None if stopped else "the job has not confirmed that it stopped"
    except (LauncherError, subprocess.CalledProcessError) as error:
        detail = f"{shlex.join(error.cmd)} exited with {error.returncode}" if isinstance(
            error, subprocess.CalledProcessError) else str(error)
        print(f"[tpu_vm] failed: {detail}", file=sys.stderr, flush=True)
        code = 1
        keep_reason = "the job may still be running" if state["job_may_run"] else None
    finally:
        clean_up(gcloud, inputs, args, keep_reason)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
