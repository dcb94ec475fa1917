"""Whether a TPU pod slice's runtime can serve this template's TensorFlow, for scripts/tpu_vm.py.

TensorFlow drives a pod slice from one client on worker 0, talking to a TPU server on every host that the TPU
software version starts: both must be the same TensorFlow. The client's is requirements-tpu.txt's tensorflow-tpu.
"""

import os
import re

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Rewrites every host's TPU server to another TensorFlow image, as Google's TF pod tests do (not verified here).
ALIGN_TPU_SERVER = ("sudo sed -i 's|TF_DOCKER_URL=[^\" ]*|TF_DOCKER_URL={image}|' {unit} && grep -q {image} {unit} && "
                    "sudo systemctl daemon-reload && sudo systemctl restart tpu-runtime")
TPU_RUNTIME_UNIT = "/etc/systemd/system/tpu-runtime.service"
_TF_RUNTIME = re.compile(r"tpu-vm-tf-(\d+\.\d+)[.\w]*?(-pod)?(?:-pjrt|-se)?")


def pinned_tensorflow(requirements: str = "requirements-tpu.txt", package: str = "tensorflow-tpu") -> str:
    """The version of `package` a requirements file pins (requirements-tpu.txt: the pod's client TensorFlow)."""
    with open(os.path.join(REPO_ROOT, requirements)) as handle:
        match = re.search(rf"^{re.escape(package)}==(\S+)", handle.read(), re.MULTILINE)
    return match.group(1)


def pod_runtime_problem(accelerator_type: str, version: str, client: str, server_image: str | None) -> str | None:
    """Why `version` cannot run a pod slice with TensorFlow `client` on worker 0, or None if it can."""
    match = _TF_RUNTIME.fullmatch(version)
    minor = ".".join(client.split(".")[:2])
    if not match or not match.group(2):
        return (f"{accelerator_type} is a pod slice, and --version={version!r} is not a TensorFlow pod runtime: "
                "every host must run TensorFlow's TPU server, which only the tpu-vm-tf-X.Y.Z-pod[-pjrt] runtimes "
                f"start. Pass --version=tpu-vm-tf-{minor}.0-pod-pjrt (v5e and later) or tpu-vm-tf-{minor}.0-pod "
                "if Google publishes it, or an older pod runtime with --tpu_server_image.")
    if match.group(1) != minor and not server_image:
        return (f"the TPU runtime {version} runs TensorFlow {match.group(1)} in every host's TPU server, but worker "
                f"0's client is tensorflow-tpu {client} (requirements-tpu.txt); a pod needs the same TensorFlow on "
                f"both. Fix: --tpu_server_image=<TF {minor} TPU server image> rewrites {TPU_RUNTIME_UNIT} on every "
                f"worker (as Google's TensorFlow tests do; not verified here), or use a tpu-vm-tf-{minor}.x-pod "
                f"runtime if one exists (the newest documented is 2.18), or install TensorFlow {match.group(1)} on "
                "the workers instead.")
    return None
