"""A stand-in for `gcloud compute tpus ...` (Google Cloud cannot be reached from here), for scripts/tpu_vm.py's tests.

It logs every call to calls.jsonl in $FAKE_GCLOUD_DIR and follows scenario.json there:
- create (tpu-vm or queued-resources): fails with the next message of `create_errors`, if any (exit 1);
- queued-resources describe: the next state of `queued_states` (then ACTIVE);
- tpu-vm describe: the TPU's state (state.txt: READY after a create; PREEMPTED after a simulated preemption);
- tpu-vm scp: copies the archive to $FAKE_GCLOUD_DIR/home/ under the name it is given (`NAME:~/FILE`), as the
  real scp delivers it to each worker's home, so tests can read what was sent;
- tpu-vm ssh: the install command succeeds without running; the others (start, poll, stop) RUN in a local bash with
  HOME=$FAKE_GCLOUD_DIR/home, standing in for worker 0, whose `.venv/bin/python` is a fake train.py (below).
  The Nth job command (start, poll, stop: counted from 1) listed in `ssh_drops` fails like a dropped connection
  (exit 255) without running; at the Nth listed in `preempt_at`, the job is killed (SIGKILL) and the TPU PREEMPTED.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

# train.py on the fake worker: records the arguments it received (home/argv-N.json for attempt N), prints `lines`
# steps `seconds` apart, then exits with `exit` (or kills itself with SIGTERM for "sigterm"); SIGTERM while running
# prints a checkpoint line and exits 3, like the real one.
FAKE_TRAIN = """#!{python}
import json, os, signal, sys, time
attempts = os.path.join(os.environ['HOME'], 'attempts')
number = len(open(attempts).read()) if os.path.exists(attempts) else 0
open(attempts, 'a').write('x')
plan = json.load(open(os.path.join(os.environ['HOME'], 'train_plan.json')))[number]
def on_sigterm(*_):
    print('SIGTERM: checkpoint saved at the last loop', flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, on_sigterm)
json.dump(sys.argv[1:], open(os.path.join(os.environ['HOME'], f'argv-{{number}}.json'), 'w'))  # As received.
print('attempt', number, 'TPU_ACCELERATOR_TYPE=' + os.environ.get('TPU_ACCELERATOR_TYPE', ''), flush=True)
for step in range(plan['lines']):
    print(f'attempt {{number}} step {{step}} ' + 'x' * 40, flush=True)
    time.sleep(plan.get('seconds', 0.02))
if plan['exit'] == 'sigterm':
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(plan['exit'])
"""


def _scenario() -> dict:
    with open(os.path.join(os.environ["FAKE_GCLOUD_DIR"], "scenario.json")) as handle:
        return json.load(handle)


def _next(counter: str) -> int:
    path = os.path.join(os.environ["FAKE_GCLOUD_DIR"], f"{counter}.count")
    count = (int(open(path).read()) if os.path.exists(path) else 0) + 1
    open(path, "w").write(str(count))
    return count


def _set_state(state: str) -> None:
    open(os.path.join(os.environ["FAKE_GCLOUD_DIR"], "state.txt"), "w").write(state)


def _create(scenario: dict) -> int:
    errors = scenario.get("create_errors", [])
    number = _next("create")
    if number <= len(errors):
        print(errors[number - 1], file=sys.stderr)
        return 1
    _set_state("READY")
    return 0


def _ssh(argv: list[str], scenario: dict) -> int:
    command = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--command="))
    if "pip install" in command or "systemctl" in command:
        return 0  # Installing on a worker: nothing to do here.
    number = _next("job_ssh")
    if number in scenario.get("ssh_drops", []):
        print("Connection closed by remote host.", file=sys.stderr)
        return 255
    if number in scenario.get("preempt_at", []):
        job_dir = os.path.join(os.environ["FAKE_GCLOUD_DIR"], "home", "tpu-template", "job")
        for name in os.listdir(job_dir):
            if name.endswith(".pid"):
                try:  # The job's whole session (script and train.py), as when the VM goes down.
                    os.killpg(os.getpgid(int(open(os.path.join(job_dir, name)).read())), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        _set_state("PREEMPTED")
        print("Connection closed by remote host.", file=sys.stderr)
        return 255
    home = os.path.join(os.environ["FAKE_GCLOUD_DIR"], "home")
    result = subprocess.run(["bash", "-c", command], env={**os.environ, "HOME": home}, capture_output=True)
    sys.stdout.buffer.write(result.stdout)
    sys.stderr.buffer.write(result.stderr)
    return result.returncode


def main(argv: list[str]) -> int:
    with open(os.path.join(os.environ["FAKE_GCLOUD_DIR"], "calls.jsonl"), "a") as log:
        log.write(json.dumps(argv) + "\n")
    scenario = _scenario()
    group, verb = argv[2], argv[3]  # compute tpus {tpu-vm|queued-resources} VERB ...
    if verb == "create":
        return _create(scenario)
    if group == "queued-resources" and verb == "describe":
        states = scenario.get("queued_states", [])
        number = _next("queued_describe")
        print(states[number - 1] if number <= len(states) else "ACTIVE")
        return 0
    if verb == "describe":
        path = os.path.join(os.environ["FAKE_GCLOUD_DIR"], "state.txt")
        if not os.path.exists(path):
            print("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource not found", file=sys.stderr)
            return 1
        print(open(path).read())
        return 0
    if verb == "ssh":
        return _ssh(argv, scenario)
    if verb == "scp":
        source, target = argv[4], argv[5].split(":~/", 1)[1]
        shutil.copyfile(source, os.path.join(os.environ["FAKE_GCLOUD_DIR"], "home", target))
        return 0
    if verb == "delete":
        _set_state("DELETED")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
