"""requirements-tpu.txt installs where TPU users are: CPython 3.11, 3.12 and 3.13 (Colab) on manylinux x86_64.

Offline: pip's resolution for each Python, kept trimmed in tests/data/tpu_requirements_resolution.json, must pin
exactly what the requirement files say, hold one TensorFlow, and every wheel's tags must install on that Python.
The `index` test redoes the resolution against the package index for Python 3.13 (PyPI, reachable from CI).
"""

import json
import os
import subprocess
import sys

import pytest
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from tests.helpers import REPO_ROOT
from tpu_utils.tpu.startup import TF_COMPATIBLE_LIBTPU

RESOLUTION = os.path.join(REPO_ROOT, "tests", "data", "tpu_requirements_resolution.json")
PYTHONS = ("3.11", "3.12", "3.13")
# Colab and TPU VM images are Ubuntu 22.04 (glibc 2.35); the dry-run asked for up to manylinux_2_31.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(31, 4, -1)] + [
    f"{legacy}_x86_64" for legacy in ("manylinux2014", "manylinux2010", "manylinux1")]
TENSORFLOWS = {"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-intel", "tf-nightly", "tensorflow-gpu"}


def _pins(name: str) -> dict:
    """{canonical name: version} of the `==` pins in a requirements file and the files it includes with -r."""
    pins = {}
    with open(os.path.join(REPO_ROOT, name)) as handle:
        for line in handle:
            line = line.split("#")[0].strip()
            if line.startswith("-r "):
                pins.update(_pins(line[3:].strip()))
            elif "==" in line:
                package, version = line.split("==")
                pins[canonicalize_name(package.split("[")[0])] = version.strip()
    return pins


def _resolution() -> dict:
    with open(RESOLUTION) as handle:
        return json.load(handle)["python"]


def _supported_tags(python: str) -> set:
    version = tuple(int(part) for part in python.split("."))
    return set(cpython_tags(version, platforms=PLATFORMS)) | set(compatible_tags(version, f"cp{version[0]}{version[1]}",
                                                                                  platforms=PLATFORMS))


def _check_resolution(python: str, installs: list[dict]) -> None:
    resolved = {canonicalize_name(item["name"]): item for item in installs}
    for package, version in _pins("requirements-tpu.txt").items():
        assert package in resolved, f"Python {python}: {package}=={version} is pinned but was not resolved"
        assert resolved[package]["version"] == version, (python, package, resolved[package]["version"], version)
    assert [name for name in resolved if name in TENSORFLOWS] == ["tensorflow-tpu"], f"Python {python}: one TF"
    supported = _supported_tags(python)
    for item in installs:
        _, version, _, tags = parse_wheel_filename(item["wheel"])
        assert str(version) == item["version"], item
        assert tags & supported, f"Python {python}: {item['wheel']} does not install on CPython {python} x86_64"


def test_the_pins_are_the_ones_checked_here():
    pins = _pins("requirements-tpu.txt")
    assert pins["libtpu"] == TF_COMPATIBLE_LIBTPU  # The start-up warns about any other libtpu.
    assert pins["tensorflow-tpu"] == _pins("requirements.txt")["tensorflow-cpu"]  # What CI tests runs on the TPU.


@pytest.mark.parametrize("python", PYTHONS)
def test_the_recorded_resolution_installs_on(python):
    _check_resolution(python, _resolution()[python])


def test_the_tag_check_fails_on_a_wheel_of_another_python():
    """Negative control: libtpu 0.0.21 (no cp313 wheel) and a cp311-only wheel are refused for Python 3.13."""
    installs = [dict(item) for item in _resolution()["3.13"]]
    libtpu = next(item for item in installs if item["name"] == "libtpu")
    libtpu["wheel"] = libtpu["wheel"].replace("cp313", "cp311")
    with pytest.raises(AssertionError, match="does not install on CPython 3.13"):
        _check_resolution("3.13", installs)
    libtpu["version"] = "0.0.21"
    with pytest.raises(AssertionError, match="libtpu"):
        _check_resolution("3.13", installs)


@pytest.mark.index
@pytest.mark.slow
def test_pip_resolves_the_tpu_requirements_for_python_3_13(tmp_path):
    """The real resolver against the index (downloads wheel metadata; ~1-3 min with a warm pip cache)."""
    # Without the loopback GCS server's proxy and CA (tests/gcs_server/emulator.py sets them for this process once a
    # test has started it): pip must reach the real index.
    environment = {name: value for name, value in os.environ.items()
                   if name.lower() not in ("https_proxy", "http_proxy") and name not in ("CURL_CA_BUNDLE",)}
    wheels = tmp_path / "wheels"  # promise (a TFDS dependency) is an sdist only: a wheel of it, built here.
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "promise==2.3", "-w", str(wheels)],
                           capture_output=True, text=True, timeout=600, env=environment)
    assert built.returncode == 0, built.stderr[-3000:]
    report = tmp_path / "report.json"
    platforms = [argument for platform in PLATFORMS
                 for argument in ("--platform", platform)]
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                             "--report", str(report), "--python-version", "3.13", "--only-binary=:all:", *platforms,
                             "--find-links", str(wheels), "--target", str(tmp_path / "target"),
                             "-r", "requirements-tpu.txt"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    installs = [{"name": item["metadata"]["name"], "version": item["metadata"]["version"],
                 "wheel": item["download_info"]["url"].rsplit("/", 1)[-1]}
                for item in json.loads(report.read_text())["install"]]
    _check_resolution("3.13", installs)
