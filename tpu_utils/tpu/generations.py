"""What an accelerator type means: TPU generation, chips, replicas, hosts, and which TensorFlow TPU runtime it needs.

Accelerator types are the names `gcloud compute tpus` and the TPU VM metadata use: `v3-8`, `v4-16`, `v5litepod-8`,
`v5p-8`, `v6e-1`. The number counts TensorCores on v2, v3, v4 and v5p, and chips on v5e and v6e. TensorFlow sees
one TPU device (one replica) per TensorCore on v2/v3 (two per chip) and one per chip from v4 on (v4 and v5p join
their two cores as one "megacore" device; v5e and v6e have one core per chip).

Runtime: v2, v3 and v4 use TensorFlow's classic TPU runtime (libtpu loaded through TF's TPU C API); v5e, v5p, v6e
and later generations only through the PJRT pluggable device (Cloud TPU docs; Google's own TensorFlow TPU tests
export the PJRT variables for them). Pure data and parsing: no I/O, no TensorFlow.
"""

import dataclasses
import re

PJRT = "pjrt"
CLASSIC = "classic"


@dataclasses.dataclass(frozen=True)
class Generation:
    name: str  # 'v5e'
    prefixes: tuple[str, ...]  # accelerator-type prefixes before '-N'
    counts_cores: bool  # the N of the accelerator type counts TensorCores (else chips)
    cores_per_chip: int
    devices_per_chip: int  # TensorFlow TPU devices (= replicas) per chip
    max_single_host_chips: int  # larger slices span several hosts (pods), 4 chips per host
    runtime: str


GENERATIONS = (
    Generation("v2", ("v2",), counts_cores=True, cores_per_chip=2, devices_per_chip=2, max_single_host_chips=4,
               runtime=CLASSIC),
    Generation("v3", ("v3",), counts_cores=True, cores_per_chip=2, devices_per_chip=2, max_single_host_chips=4,
               runtime=CLASSIC),
    Generation("v4", ("v4",), counts_cores=True, cores_per_chip=2, devices_per_chip=1, max_single_host_chips=4,
               runtime=CLASSIC),
    Generation("v5e", ("v5litepod", "v5e"), counts_cores=False, cores_per_chip=1, devices_per_chip=1,
               max_single_host_chips=8, runtime=PJRT),
    Generation("v5p", ("v5p",), counts_cores=True, cores_per_chip=2, devices_per_chip=1, max_single_host_chips=4,
               runtime=PJRT),
    Generation("v6e", ("v6e",), counts_cores=False, cores_per_chip=1, devices_per_chip=1, max_single_host_chips=8,
               runtime=PJRT),
)
BY_NAME = {generation.name: generation for generation in GENERATIONS}
_BY_PREFIX = {prefix: generation for generation in GENERATIONS for prefix in generation.prefixes}
CHIPS_PER_POD_HOST = 4

# PCI device IDs of Google TPU chips (vendor 0x1ae0) under /sys/bus/pci/devices, as JAX's hardware_utils.py reads
# them (not checked on hardware here); v2 and v3 share one ID (both classic, two devices per chip: same decision).
GOOGLE_PCI_VENDOR = "0x1ae0"
PCI_DEVICE_GENERATIONS = {"0x0027": "v3", "0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e", "0x006f": "v6e"}

_ACCELERATOR_TYPE = re.compile(r"(?:v|tpu)(\d+)([a-z]*)-(\d+)")


@dataclasses.dataclass(frozen=True)
class Slice:
    """A parsed accelerator type. `generation` is None for a generation newer than this table (e.g. v7)."""

    accelerator_type: str
    major: int  # 5 for v5litepod-8
    generation: Generation | None
    chips: int | None  # None when the generation (and so what N counts) is unknown
    hosts: int | None

    @property
    def replicas(self) -> int | None:
        return None if self.generation is None else self.chips * self.generation.devices_per_chip

    @property
    def pod(self) -> bool:
        return bool(self.hosts and self.hosts > 1)

    @property
    def runtime(self) -> str:
        """PJRT from v5 on (v5e, v5p, v6e and any later generation), the classic runtime for v2, v3 and v4."""
        return self.generation.runtime if self.generation else (PJRT if self.major >= 5 else CLASSIC)


def parse_accelerator_type(accelerator_type: str) -> Slice:
    """`v5litepod-8` -> Slice(v5e, 8 chips, 1 host). ValueError naming the value when it is not an accelerator type."""
    match = _ACCELERATOR_TYPE.fullmatch(accelerator_type.strip().lower())
    if not match:
        raise ValueError(f"accelerator type {accelerator_type!r}: expected e.g. v3-8, v4-8, v5litepod-1, v5p-8, "
                         "v6e-8, v3-32 (as in `gcloud compute tpus accelerator-types list --zone=ZONE`).")
    major, number = int(match.group(1)), int(match.group(3))
    generation = _BY_PREFIX.get(f"v{major}{match.group(2)}")
    if generation is None:
        if major <= 6:  # A known generation spelled wrongly: better an error than a guess.
            known = ", ".join(prefix for g in GENERATIONS for prefix in g.prefixes)
            raise ValueError(f"accelerator type {accelerator_type!r}: unknown TPU generation; known prefixes are "
                             f"{known}.")
        return Slice(accelerator_type, major, None, None, None)
    chips = number // generation.cores_per_chip if generation.counts_cores else number
    if chips < 1 or (generation.counts_cores and number % generation.cores_per_chip):
        raise ValueError(f"accelerator type {accelerator_type!r}: {number} TensorCores is not a whole number of "
                         f"{generation.name} chips ({generation.cores_per_chip} cores each).")
    hosts = 1 if chips <= generation.max_single_host_chips else -(-chips // CHIPS_PER_POD_HOST)
    return Slice(accelerator_type, major, generation, chips, hosts)
