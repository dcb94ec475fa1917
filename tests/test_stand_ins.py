"""The stand-ins other than the GCS server (docs/testing.md has the whole audit): the loopback metadata server
(tests/metadata_stub.py) refuses what the real one refuses, and our own metadata reader gets a TPU VM's answer
from it.
"""

import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request

import pytest

from tests.helpers import REPO_ROOT
from tpu_utils.tpu.facts import read_accelerator_type_from_metadata

ACCELERATOR_TYPE = "/computeMetadata/v1/instance/attributes/accelerator-type"


@pytest.fixture
def tpu_vm_metadata(tmp_path):
    """A metadata stub answering what a v5e TPU VM's metadata server answers for its accelerator type."""
    values, port_file = tmp_path / "values.json", tmp_path / "port"
    values.write_text(json.dumps({ACCELERATOR_TYPE: "v5litepod-8"}))
    stub = subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "tests", "metadata_stub.py"), str(port_file),
                             str(values)])
    deadline = time.monotonic() + 20
    while not port_file.exists():
        assert stub.poll() is None and time.monotonic() < deadline, "the metadata stub did not start"
        time.sleep(0.02)
    yield f"127.0.0.1:{port_file.read_text()}"
    stub.terminate()
    stub.wait(timeout=10)


def test_the_metadata_stub_refuses_requests_without_the_flavor_header_as_the_real_server_does(tpu_vm_metadata):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{tpu_vm_metadata}{ACCELERATOR_TYPE}", timeout=5)
    assert refused.value.code == 403
    request = urllib.request.Request(f"http://{tpu_vm_metadata}{ACCELERATOR_TYPE}",
                                     headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.read() == b"v5litepod-8" and response.headers["Metadata-Flavor"] == "Google"


def test_the_tpu_facts_reader_gets_the_accelerator_type_from_a_tpu_vm_metadata_server(tpu_vm_metadata):
    assert read_accelerator_type_from_metadata({"GCE_METADATA_HOST": tpu_vm_metadata}) == "v5litepod-8"
    session_stub = os.environ["GCE_METADATA_HOST"]  # Negative control: the session's stub is no TPU VM.
    assert read_accelerator_type_from_metadata({"GCE_METADATA_HOST": session_stub}) is None


def test_the_real_archives_odd_images_are_stored_as_jpeg_and_decode_to_rgb(tmp_path):
    """Real ImageNet holds grayscale JPEGs, 22 CMYK JPEGs and one PNG named .JPEG; the noise tars hold none. TFDS's
    builder converts the CMYK and PNG ones by name, and data/imagenet.py's decoders (decode_and_crop_jpeg, JPEG only)
    turn every stored image into 224 x 224 x 3."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from data import imagenet
    from tests.fake_imagenet import prepare_fake_imagenet

    builder = prepare_fake_imagenet(str(tmp_path / "tfds"), str(tmp_path / "manual"), classes=2, per_class=2,
                                    validation=3, oddities=True)
    seen = set()
    for split in ("train", "validation"):
        for example in builder.as_dataset(split=split, decoders={"image": tfds.decode.SkipDecoding()}):
            encoded, name = example["image"], example["file_name"].numpy().decode()
            assert encoded.numpy()[:2] == b"\xff\xd8", f"{name} is not stored as a JPEG"
            for image in (imagenet.eval_decoder(encoded), imagenet.train_decoder(encoded, tf.constant([1, 2]))):
                assert image.shape == (224, 224, 3) and bool(tf.reduce_all(tf.math.is_finite(image)))
            seen.add(name)
    assert {"n01739381_1309.JPEG", "n02105855_2933.JPEG", "n01739381_gray.JPEG"} <= seen
    with tarfile.open(tmp_path / "manual" / "ILSVRC2012_img_train.tar") as train:  # Negative control: not JPEG there.
        with tarfile.open(fileobj=train.extractfile("n02105855.tar")) as png_class:
            assert png_class.extractfile("n02105855_2933.JPEG").read()[:4] == b"\x89PNG"



def named_tests_missing(text: str) -> tuple[int, list[str]]:
    """(how many, which do not exist) of the tests `text` names as `file.py::test_name` ('...' abbreviates)."""
    import ast
    import re

    named = re.findall(r"`(?:tests/)?(test_\w+\.py)::(test_\w+?)(\.\.\.)?(?:\[[^\]]*\])?`", text)
    missing = []
    for file, name, abbreviated in named:
        tree = ast.parse(open(os.path.join(REPO_ROOT, "tests", file)).read())
        tests = [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
        if not any(test == name or (abbreviated and test.startswith(name)) for test in tests):
            missing.append(f"{file}::{name}")
    return len(named), missing


def test_every_test_the_testing_docs_name_exists():
    count, missing = named_tests_missing(open(os.path.join(REPO_ROOT, "docs", "testing.md")).read())
    assert count >= 15 and not missing, f"docs/testing.md names tests that do not exist: {missing}"
    # Negative control: a renamed test is reported.
    assert named_tests_missing("`test_gcs.py::test_gone` `test_gcs.py::test_a_missing_...`") == (
        2, ["test_gcs.py::test_gone"])
