"""A stand-in for `gcloud compute tpus|instances|ssh|scp ...` (Google Cloud cannot be reached from here), for
scripts/tpu_vm.py's tests.

It logs every call to calls.jsonl in $FAKE_GCLOUD_DIR and follows scenario.json there:
- create (tpu-vm or queued-resources): fails with the next message of `create_errors`, if any (exit 1);
- queued-resources describe: the next state of `queued_states` (then ACTIVE);
- tpu-vm delete: takes `tpu_delete_seconds` (default 0);
- tpu-vm describe: the TPU's state (state.txt: READY after a create; PREEMPTED after a simulated preemption);
- tpu-vm scp: copies the archive to $FAKE_GCLOUD_DIR/home/ under the name it is given (`NAME:~/FILE`), as the
  real scp delivers it to each worker's home, so tests can read what was sent;
- tpu-vm ssh: the install command succeeds without running; the others (start, poll, stop) RUN in a local bash with
  HOME=$FAKE_GCLOUD_DIR/home, standing in for worker 0, whose `.venv/bin/python` is a fake train.py (below).
  The Nth job command (start, poll, stop: counted from 1) listed in `ssh_drops` fails like a dropped connection
  (exit 255) without running; at the Nth listed in `preempt_at`, the job is killed (SIGKILL) and the TPU PREEMPTED.
- instances create NAME...: each gets the internal IP 10.128.0.{k+2} (k: its place in the command) and a home,
  $FAKE_GCLOUD_DIR/input-homes/NAME; with `instances_create_error` in the scenario, only the first
  `instances_created` (default 0) are created and the command fails with that message (exit 1);
- instances describe NAME: its IP (NOT_FOUND if it does not exist); instances delete NAME...: kills what runs in
  their homes (as deleting a VM does) and removes them (with "instances" in `delete_fails`: exit 1, nothing
  deleted);
- compute scp / compute ssh NAME: as tpu-vm scp / ssh, in that VM's home; the install command creates the
  virtualenv's `.venv/bin/python`: a fake `python -m data.service` (FAKE_SERVICE, below).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

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
for name in plan.get('kill_services', []):  # As if that input VM rebooted: its service's session is gone.
    job = os.path.join(os.environ['FAKE_GCLOUD_DIR'], 'input-homes', name, 'tpu-template', 'job')
    pid = int(open(os.path.join(job, '0.pid')).read())
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    for _ in range(300):  # Until it is reaped, as after a reboot (a zombie would still answer `kill -0`).
        if not os.path.exists(f'/proc/{{pid}}'):
            break
        time.sleep(0.1)
for step in range(plan['lines']):
    print(f'attempt {{number}} step {{step}} ' + 'x' * 40, flush=True)
    time.sleep(plan.get('seconds', 0.02))
if plan['exit'] == 'sigterm':
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(plan['exit'])
"""

# `python -m data.service` on a fake input VM: records its arguments (service-argv-N.json in the VM's home for its
# Nth start), then, as the scenario's `service_plan` {VM name: ["serve" | "fail", ...]} says for that start (default
# "serve"), prints the real one's ready line and runs until SIGTERM (exit 0), or fails at once (exit 1).
FAKE_SERVICE = """#!{python}
import json, os, signal, sys, time
home = os.environ['HOME']
starts = os.path.join(home, 'starts')
number = len(open(starts).read()) if os.path.exists(starts) else 0
open(starts, 'a').write('x')
json.dump(sys.argv[1:], open(os.path.join(home, f'service-argv-{{number}}.json'), 'w'))
scenario = json.load(open(os.path.join(os.environ['FAKE_GCLOUD_DIR'], 'scenario.json')))
plan = scenario.get('service_plan', {{}}).get(os.path.basename(home), [])
if number < len(plan) and plan[number] == 'fail':
    print('error: the fake tf.data service failed (service_plan)', flush=True)
    sys.exit(1)
flags = dict(arg[2:].split('=', 1) for arg in sys.argv[1:] if arg.startswith('--'))
def stop(*_):
    print('tf.data service stopped.', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print(f"tf.data service at grpc://{{flags['host']}}:{{flags['port']}} (fake)", flush=True)
while True:
    time.sleep(1)
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


def _instances() -> dict:
    path = os.path.join(os.environ["FAKE_GCLOUD_DIR"], "instances.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def _input_home(name: str) -> str:
    return os.path.join(os.environ["FAKE_GCLOUD_DIR"], "input-homes", name)


def kill_jobs(home: str) -> None:
    """Kills every job started under `home` (their whole sessions), as when the machine goes away."""
    job_dir = os.path.join(home, "tpu-template", "job")
    for name in os.listdir(job_dir) if os.path.isdir(job_dir) else []:
        if name.endswith(".pid"):
            try:
                os.killpg(os.getpgid(int(open(os.path.join(job_dir, name)).read())), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def _positional(argv: list[str]) -> list[str]:
    """The words of a command that are not flags (nor --zone's or --project's value)."""
    words, skip = [], False
    for arg in argv:
        if not skip and not arg.startswith("-"):
            words.append(arg)
        skip = arg in ("--zone", "--project")
    return words


def _save(instances: dict) -> None:
    json.dump(instances, open(os.path.join(os.environ["FAKE_GCLOUD_DIR"], "instances.json"), "w"))


def _compute(verb: str, argv: list[str], scenario: dict) -> int:
    """`compute instances create|describe|delete NAME...`, `compute ssh NAME`, `compute scp FILE NAME:~/FILE`."""
    instances, names = _instances(), _positional(argv)
    if verb == "create":
        error, created = scenario.get("instances_create_error"), scenario.get("instances_created", 0)
        for index, name in enumerate(names if error is None else names[:created]):
            instances[name] = f"10.128.0.{index + 2}"
            os.makedirs(_input_home(name), exist_ok=True)
        _save(instances)
        if error is not None:
            print(error, file=sys.stderr)
        return 0 if error is None else 1
    targets = names if verb == "delete" else [names[-1].split(":", 1)[0]]
    missing = [name for name in targets if name not in instances]
    for name in missing:
        print(f"ERROR: (gcloud.compute.{verb}) NOT_FOUND: The resource '{name}' was not found", file=sys.stderr)
    if verb == "delete" and "instances" in scenario.get("delete_fails", []):
        print("ERROR: (gcloud.compute.instances.delete) The resource is not ready", file=sys.stderr)
        return 1
    if verb == "delete":  # The others are deleted all the same.
        for name in targets:
            kill_jobs(_input_home(name))
            instances.pop(name, None)
        _save(instances)
        return 1 if missing else 0
    if missing:
        return 1
    home = _input_home(targets[0])
    if verb == "describe":
        print(instances[targets[0]])
    elif verb == "scp":
        shutil.copyfile(names[0], os.path.join(home, names[1].split(":~/", 1)[1]))
    elif verb == "ssh":
        command = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--command="))
        if "pip install" not in command:
            result = subprocess.run(["bash", "-c", command], env={**os.environ, "HOME": home}, capture_output=True)
            sys.stdout.buffer.write(result.stdout)
            sys.stderr.buffer.write(result.stderr)
            return result.returncode
        python = os.path.join(home, "tpu-template", ".venv", "bin", "python")  # Installing: the fake service.
        os.makedirs(os.path.dirname(python), exist_ok=True)
        open(python, "w").write(FAKE_SERVICE.format(python=sys.executable))
        os.chmod(python, 0o755)
        open(os.path.join(home, "installed"), "w").write(command)
    return 0


def main(argv: list[str]) -> int:
    with open(os.path.join(os.environ["FAKE_GCLOUD_DIR"], "calls.jsonl"), "a") as log:
        log.write(json.dumps(argv) + "\n")
    scenario = _scenario()
    if argv[1] == "instances":  # compute instances VERB ...
        return _compute(argv[2], argv[3:], scenario)
    if argv[1] in ("ssh", "scp"):  # compute ssh|scp ...
        return _compute(argv[1], argv[2:], scenario)
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
        time.sleep(scenario.get("tpu_delete_seconds", 0))
        _set_state("DELETED")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
