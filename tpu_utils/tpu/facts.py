"""Facts about the TPU runtime this process is on, gathered without importing TensorFlow or libtpu.

Sources, most explicit first:
- `TPU_ACCELERATOR_TYPE` in the environment (scripts/tpu_vm.py sets it; set it yourself, e.g. `v5litepod-1`,
  where nothing else tells the generation);
- the TPU VM metadata server's `instance/attributes/accelerator-type` (Cloud TPU VMs), asked only when this host
  has TPU chips, with a 2 s timeout, and never when `TPU_SKIP_MDS_QUERY` is set;
- TPU chips on the PCI bus (`/sys/bus/pci/devices/*/vendor` and `device`: generation and chip count) and the
  device files the chips expose (`/dev/accel*` on v2-v4, `/dev/vfio/<n>` on later generations);
- the installed libtpu (its version and the path of `libtpu.so`, found without loading it);
- `TPU_RUNTIME` ('auto', 'pjrt', 'classic' or 'off'): the user's override of the decision.
`root` lets tests point the file reads at a fake tree; `read_metadata` at a loopback server.
"""

import dataclasses
import glob
import importlib.metadata
import importlib.util
import os
import urllib.request

from tpu_utils.tpu.generations import GOOGLE_PCI_VENDOR, PCI_DEVICE_GENERATIONS

RUNTIME_CHOICES = ("auto", "pjrt", "classic", "off")
DEVICE_FILE_GLOBS = ("dev/accel[0-9]*", "dev/vfio/[0-9]*")
_METADATA_PATH = "/computeMetadata/v1/instance/attributes/accelerator-type"


@dataclasses.dataclass(frozen=True)
class RuntimeFacts:
    accelerator_type: str | None = None
    accelerator_type_source: str = ""  # where accelerator_type came from, for the log
    device_files: tuple[str, ...] = ()
    pci_generation: str | None = None
    pci_chips: int = 0
    libtpu_version: str | None = None
    libtpu_path: str | None = None  # .../site-packages/libtpu/libtpu.so
    requested_runtime: str = "auto"

    @property
    def has_tpu(self) -> bool:
        """A TPU is attached or named: /dev/vfio/<n> alone is not evidence (any VFIO pass-through makes one), so it
        counts with Google TPU chips on the PCI bus only; /dev/accel<n> is the TPU driver's own."""
        return bool(self.accelerator_type or self.pci_chips or any("/accel" in path for path in self.device_files))


def local_tpu_attached(root: str = "/") -> bool:
    """Whether this host exposes TPU chips (a TPU VM or a Colab TPU runtime), by the rule of `RuntimeFacts.has_tpu`
    without the accelerator type: a few file reads, never the network."""
    device_files = [path for pattern in DEVICE_FILE_GLOBS for path in glob.glob(os.path.join(root, pattern))]
    return RuntimeFacts(device_files=tuple(device_files), pci_chips=_pci_tpu_chips(root)[1]).has_tpu


def gather_facts(environ=os.environ, *, root: str = "/", read_metadata=None) -> RuntimeFacts:
    """Reads the facts above; cheap (a few file globs) when this host has no TPU, and never touches the network then."""
    device_files = tuple(sorted(path for pattern in DEVICE_FILE_GLOBS
                                for path in glob.glob(os.path.join(root, pattern))))
    pci_generation, pci_chips = _pci_tpu_chips(root)
    accelerator_type, source = environ.get("TPU_ACCELERATOR_TYPE") or None, "TPU_ACCELERATOR_TYPE"
    attached = RuntimeFacts(device_files=device_files, pci_chips=pci_chips).has_tpu
    if not accelerator_type and attached and not environ.get("TPU_SKIP_MDS_QUERY"):
        accelerator_type = (read_metadata or (lambda: read_accelerator_type_from_metadata(environ)))()
        source = "the TPU VM metadata server"
    if not accelerator_type:
        source = ""
    libtpu_version, libtpu_path = find_libtpu()
    return RuntimeFacts(accelerator_type=accelerator_type, accelerator_type_source=source, device_files=device_files,
                        pci_generation=pci_generation, pci_chips=pci_chips, libtpu_version=libtpu_version,
                        libtpu_path=libtpu_path, requested_runtime=environ.get("TPU_RUNTIME", "auto").strip().lower())


def read_accelerator_type_from_metadata(environ=os.environ, timeout: float = 2.0) -> str | None:
    """The TPU VM's accelerator type from the GCE metadata server (GCE_METADATA_HOST if set), or None."""
    host = environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
    request = urllib.request.Request(f"http://{host}{_METADATA_PATH}", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - a fixed http URL.
            return response.read().decode().strip() or None
    except (OSError, ValueError):  # Not a TPU VM (no metadata server), or the attribute is missing (404).
        return None


def find_libtpu() -> tuple[str | None, str | None]:
    """(version, path of libtpu.so) of the installed libtpu package, without importing (loading) it."""
    try:
        spec = importlib.util.find_spec("libtpu")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, None
    path = os.path.join(list(spec.submodule_search_locations)[0], "libtpu.so")
    try:
        version = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return version, path if os.path.isfile(path) else None


def _pci_tpu_chips(root: str) -> tuple[str | None, int]:
    """(generation, chip count) of the Google TPU chips on this host's PCI bus, or (None, 0)."""
    generations = []
    for device_dir in glob.glob(os.path.join(root, "sys/bus/pci/devices/*")):
        try:
            with open(os.path.join(device_dir, "vendor")) as vendor, open(os.path.join(device_dir, "device")) as device:
                vendor_id, device_id = vendor.read().strip().lower(), device.read().strip().lower()
        except OSError:
            continue
        if vendor_id == GOOGLE_PCI_VENDOR and device_id in PCI_DEVICE_GENERATIONS:
            generations.append(PCI_DEVICE_GENERATIONS[device_id])
    return (generations[0] if generations else None), len(generations)
