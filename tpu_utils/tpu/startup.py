"""One TPU start-up for every generation: from the runtime's facts, decide PJRT or the classic runtime, and set the
environment TensorFlow reads when it is imported.

TensorFlow reads these variables once, at import; so this runs first (train.py calls `prepare_tpu_environment`
before it imports any training module, the Colab notebook in its first cells, scripts/tpu_vm.py uses `decide` for
the accelerator type it creates):
- v5e, v5p, v6e and later: the PJRT pluggable device, `NEXT_PLUGGABLE_DEVICE_USE_C_API=true` and
  `TF_PLUGGABLE_DEVICE_LIBRARY_PATH=<site-packages>/libtpu/libtpu.so`;
- v2, v3, v4: nothing to set (TensorFlow's classic TPU runtime loads libtpu itself), as before;
- a pod slice (several hosts), on worker 0: `TPU_LOAD_LIBRARY=0`, so the chips stay with every host's TPU server.
Variables already in the environment win (they are the user's explicit choice) and the log says so.
`TPU_RUNTIME=pjrt|classic` overrides the decision, `TPU_RUNTIME=off` turns it off (a CPU run on a TPU host).
What it decides for a host, as `export` lines: `python -m scripts.tpu_startup` (an extra).
"""

import dataclasses
import logging
import os
import sys

from tpu_utils.tpu.facts import RUNTIME_CHOICES, RuntimeFacts, gather_facts
from tpu_utils.tpu.generations import BY_NAME, CLASSIC, PJRT, parse_accelerator_type

log = logging.getLogger(__name__)

NONE = "none"
# The libtpu requirements-tpu.txt pins: the newest release checked to still export TensorFlow's TPU C API.
TF_COMPATIBLE_LIBTPU = "0.0.21.1"
PJRT_ENV = ("NEXT_PLUGGABLE_DEVICE_USE_C_API", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")


@dataclasses.dataclass(frozen=True)
class StartupDecision:
    generation: str | None  # 'v5e'; None without a TPU or when the generation cannot be told
    accelerator_type: str | None
    chips: int  # on the whole slice when the accelerator type is known, else on this host
    replicas: int | None  # TensorFlow TPU devices on the slice, when known
    pod: bool
    runtime: str  # 'pjrt', 'classic' or 'none' (no TPU, or TPU_RUNTIME=off)
    env: dict = dataclasses.field(default_factory=dict)  # to set before TensorFlow is imported
    notes: tuple[str, ...] = ()  # warnings: what could not be decided, or looks wrong, and the fix

    def summary(self) -> str:
        if self.runtime == NONE:
            return "TPU start-up: " + (self.notes[0] if self.notes else "no TPU on this host; nothing to set.")
        what = f"{self.generation or 'unknown generation'} ({self.accelerator_type or 'accelerator type unknown'})"
        shape = f"{self.chips} chip(s)" + (f", {self.replicas} replica(s)" if self.replicas else "")
        runtime = "PJRT pluggable device" if self.runtime == PJRT else "classic TPU runtime"
        settings = " ".join(f"{key}={value}" for key, value in self.env.items()) or "nothing to set"
        text = f"TPU start-up: {what}, {shape}, {'pod slice' if self.pod else 'single host'}, {runtime}: {settings}"
        return text + "".join(f"\n  note: {note}" for note in self.notes)


def decide(facts: RuntimeFacts, *, expected_libtpu: str = TF_COMPATIBLE_LIBTPU) -> StartupDecision:
    """The start-up decision for `facts`. Pure: the same facts give the same decision, and nothing is read or set."""
    if facts.requested_runtime not in RUNTIME_CHOICES:
        raise ValueError(f"TPU_RUNTIME={facts.requested_runtime!r}: expected one of {', '.join(RUNTIME_CHOICES)}.")
    if facts.requested_runtime == "off" or not facts.has_tpu:
        note = "TPU_RUNTIME=off: TPU start-up skipped." if facts.has_tpu else "no TPU on this host; nothing to set."
        return StartupDecision(None, facts.accelerator_type, 0, None, False, NONE, {}, (note,))
    notes = []
    slice_ = None
    if facts.accelerator_type:
        try:
            slice_ = parse_accelerator_type(facts.accelerator_type)
        except ValueError as error:
            notes.append(f"{error} (from {facts.accelerator_type_source}); using the chips on this host instead.")
    local_chips = facts.pci_chips or len(facts.device_files)
    if slice_ is not None and slice_.generation is not None:
        generation, chips, replicas, pod, runtime = (slice_.generation.name, slice_.chips, slice_.replicas,
                                                     slice_.pod, slice_.runtime)
    else:
        generation = facts.pci_generation
        chips, pod = local_chips, False
        replicas = chips * BY_NAME[generation].devices_per_chip if generation and chips else None
        if slice_ is not None:  # A generation newer than this template's table: PJRT, like v5e and later.
            runtime = slice_.runtime
        elif generation:
            runtime = BY_NAME[generation].runtime
        else:
            runtime = CLASSIC
            notes.append("TPU generation unknown (no accelerator type, no known TPU chip on the PCI bus): the "
                         "classic runtime, as for v2-v4. On v5e, v5p, v6e or later set TPU_ACCELERATOR_TYPE "
                         "(e.g. v5litepod-8) or TPU_RUNTIME=pjrt.")
    if facts.requested_runtime in (PJRT, CLASSIC) and facts.requested_runtime != runtime:
        notes.append(f"TPU_RUNTIME={facts.requested_runtime} overrides the {runtime} runtime this generation needs.")
        runtime = facts.requested_runtime
    env = {}
    if runtime == PJRT:
        if facts.libtpu_path:
            env = {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": facts.libtpu_path}
        else:
            notes.append("PJRT needs libtpu, which is not installed: `pip install -r requirements-tpu.txt`, then "
                         "restart the process (Colab: Runtime > Restart session).")
    if pod:
        env["TPU_LOAD_LIBRARY"] = "0"
    if facts.libtpu_version and facts.libtpu_version != expected_libtpu:
        notes.append(f"libtpu {facts.libtpu_version} is installed; this template pins {expected_libtpu}, the newest "
                     "release checked to export TensorFlow's TPU C API (0.0.52 lacks most of it): "
                     "`pip install -r requirements-tpu.txt`.")
    return StartupDecision(generation, facts.accelerator_type, chips, replicas, pod, runtime, env, tuple(notes))


def prepare_tpu_environment(environ=os.environ, facts: RuntimeFacts | None = None) -> StartupDecision:
    """Gathers the facts, decides, sets the decision's variables in `environ` (keeping any already set) and logs it.

    Call it before TensorFlow is imported; if TensorFlow is already loaded the variables cannot take effect, and
    this says so.
    """
    decision = decide(facts if facts is not None else gather_facts(environ))
    kept = {key: environ[key] for key, value in decision.env.items() if environ.get(key, value) != value}
    for key, value in decision.env.items():
        environ.setdefault(key, value)
    if decision.runtime == NONE:
        log.debug("%s", decision.summary())
        return decision
    log.info("%s", decision.summary())
    for key, value in kept.items():
        log.info("TPU start-up: keeping %s=%s from the environment (the decision was %s).", key, value,
                 decision.env[key])
    if "tensorflow" in sys.modules and decision.env:
        log.warning("TPU start-up: TensorFlow was imported before these variables were set, so they may have no "
                    "effect. Call tpu_utils.tpu.startup.prepare_tpu_environment() before anything imports "
                    "TensorFlow (Colab: Runtime > Restart session, then run the cells in order).")
    return decision
