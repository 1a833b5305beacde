"""The machine's slots: one per GPU found at start, else CPU slots.

    slots = detect_slots(cpu_slots=2)  # [Slot(0, "gpu", "NVIDIA H100 80GB HBM3", 81559, "0")]
    env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices([slots[i] for i in assigned])
    console.print(slot_table(slots, busy={0: "trial 7 (experiment 2)"}))
    write_slot_file(layout.slot_file, slots)  # for `localdet submit`, which runs no daemon

GPUs come from `nvidia-smi`; where it is missing but the NVIDIA driver is loaded, from
TensorFlow in a subprocess (TensorFlow is never imported in the daemon itself). The daemon's
own CUDA_VISIBLE_DEVICES limits which GPUs count. Without a GPU nothing is started beyond
one attempt to run `nvidia-smi`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.table import Table

GPU, CPU = "gpu", "cpu"
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total",
                    "--format=csv,noheader,nounits"]
NVIDIA_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
NVIDIA_SMI_TIMEOUT = 20.0
TENSORFLOW_TIMEOUT = 120.0
# Run as `python -c`: prints one JSON line, the names of the GPUs TensorFlow sees.
_TF_LIST_GPUS = """\
import json, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
names = []
for gpu in tf.config.list_physical_devices("GPU"):
    try:
        names.append(tf.config.experimental.get_device_details(gpu).get("device_name") or "GPU")
    except Exception:
        names.append("GPU")
print(json.dumps(names))
"""


@dataclass(frozen=True)
class Slot:
    index: int                # 0..n-1, what the scheduler hands out
    kind: str                 # "gpu" or "cpu"
    name: str                 # "NVIDIA H100 80GB HBM3", or "CPU"
    memory_mib: int | None = None
    device: str | None = None  # the GPU as CUDA_VISIBLE_DEVICES names it; None for a CPU slot


@dataclass(frozen=True)
class _Gpu:
    index: str
    uuid: str
    name: str
    memory_mib: int | None


def _visible_entries(environ: Mapping[str, str]) -> list[str] | None:
    """The daemon's CUDA_VISIBLE_DEVICES as a list, or None when unset. CUDA reads it up to
    the first entry that names no device; "-1" (or empty) hides every GPU."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries


def _from_nvidia_smi(run) -> list[_Gpu]:
    try:
        result = run(NVIDIA_SMI_QUERY, capture_output=True, text=True,
                     timeout=NVIDIA_SMI_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return []
    if result.returncode != 0:
        return []
    gpus = []
    for line in result.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        # A name holding commas stays whole: the fields around it are fixed.
        index, uuid, name, memory = parts[0], parts[1], ", ".join(parts[2:-1]), parts[-1]
        gpus.append(_Gpu(index, uuid, name, int(memory) if memory.isdigit() else None))
    return gpus


def _select_visible(gpus: list[_Gpu], visible: list[str] | None) -> list[tuple[str, _Gpu]]:
    """(device id for a trial's CUDA_VISIBLE_DEVICES, GPU), in the order CUDA numbers them."""
    if visible is None:
        return [(gpu.index, gpu) for gpu in gpus]
    chosen = []
    for entry in visible:
        if entry.startswith("MIG-") and gpus:  # a MIG instance: nvidia-smi -L lists them
            chosen.append((entry, _Gpu(entry, entry, "MIG instance", None)))
            continue
        if entry.isdigit():
            match = next((g for g in gpus if int(g.index) == int(entry)), None)
        else:  # a UUID, or a unique prefix of one ("GPU-8f3a")
            matches = [g for g in gpus if g.uuid.startswith(entry)]
            match = matches[0] if len(matches) == 1 else None
        if match is None:
            break  # CUDA stops at the first entry naming no device
        if all(match is not g for _, g in chosen):
            chosen.append((entry, match))
    return chosen


def _from_tensorflow(run, environ: Mapping[str, str]) -> list[str]:
    """GPU names as TensorFlow (in a subprocess) sees them, or [] on any failure."""
    try:
        result = run([sys.executable, "-c", _TF_LIST_GPUS], capture_output=True, text=True,
                     timeout=TENSORFLOW_TIMEOUT, env=dict(environ))
    except (OSError, subprocess.SubprocessError):
        return []
    if result.returncode != 0:
        return []
    lines = result.stdout.strip().splitlines()
    try:
        names = json.loads(lines[-1]) if lines else []
    except ValueError:
        return []
    return [str(name) for name in names] if isinstance(names, list) else []


def _driver_present(driver_gpus: Path) -> bool:
    try:
        return any(driver_gpus.iterdir())
    except OSError:
        return False


def detect_slots(cpu_slots: int = 1, *, environ: Mapping[str, str] = os.environ,
                 run=subprocess.run, driver_gpus: Path = NVIDIA_DRIVER_GPUS) -> list[Slot]:
    """One slot per GPU this process may use; without any, `cpu_slots` CPU slots.

    `run` (subprocess.run's signature) and `driver_gpus` are there for tests."""
    visible = _visible_entries(environ)
    if visible == []:
        return cpu_only(cpu_slots)
    gpus = _from_nvidia_smi(run)
    found = [Slot(i, GPU, gpu.name, gpu.memory_mib, device)
             for i, (device, gpu) in enumerate(_select_visible(gpus, visible))]
    if not gpus and _driver_present(driver_gpus):
        # TensorFlow applies CUDA_VISIBLE_DEVICES itself: its GPU i is the i-th visible one.
        names = _from_tensorflow(run, environ)
        found = [Slot(i, GPU, name, None, visible[i] if visible else str(i))
                 for i, name in enumerate(names[:len(visible)] if visible else names)]
    return found or cpu_only(cpu_slots)


def cpu_only(count: int) -> list[Slot]:
    return [Slot(i, CPU, "CPU") for i in range(count)]


def cuda_visible_devices(slots: list[Slot]) -> str:
    """A trial's CUDA_VISIBLE_DEVICES: its GPUs' device ids, or "" (no GPU) on CPU slots."""
    return ",".join(slot.device for slot in slots if slot.kind == GPU and slot.device is not None)


def describe(slots: list[Slot]) -> str:
    """ "2 GPUs", "1 CPU slot": what a message calls the machine's slots."""
    gpus = sum(slot.kind == GPU for slot in slots)
    if gpus:
        return f"{gpus} GPU" + ("" if gpus == 1 else "s")
    return f"{len(slots)} CPU slot" + ("" if len(slots) == 1 else "s")


def _memory(mib: int | None) -> str:
    if mib is None:
        return "-"
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib} MiB"


def slot_table(slots: list[Slot], busy: dict[int, str] | None = None) -> Table:
    """The slots and what runs on each (`busy`: slot index -> "trial 7 (experiment 2)")."""
    busy = busy or {}
    table = Table(title=f"slots: {describe(slots)}")
    for column in ("slot", "kind", "device", "name", "memory", "running"):
        table.add_column(column, justify="right" if column in ("slot", "memory") else "left")
    for slot in slots:
        table.add_row(str(slot.index), slot.kind, slot.device if slot.device is not None else "-",
                      slot.name, _memory(slot.memory_mib), busy.get(slot.index, "idle"))
    return table


def write_slot_file(path: Path, slots: list[Slot]) -> None:
    """Record the daemon's slots (JSON), atomically, for commands that run no daemon."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps({"slots": [asdict(slot) for slot in slots]}, indent=2)
                         + "\n", encoding="utf-8")
    os.replace(temporary, path)


def read_slot_file(path: Path) -> list[Slot] | None:
    """The slots the last daemon recorded; None when there is no (readable) slot file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        slots = [Slot(int(s["index"]), str(s["kind"]), str(s["name"]),
                      None if s.get("memory_mib") is None else int(s["memory_mib"]),
                      None if s.get("device") is None else str(s["device"]))
                 for s in data["slots"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return slots or None
