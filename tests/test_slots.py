"""Tests of localdet.scheduling.slots: finding the machine's GPUs (through a stand-in for
subprocess.run, since this machine has none), CUDA_VISIBLE_DEVICES, the slot table and the slot
file."""

from __future__ import annotations

import json
import subprocess
import sys

from rich.console import Console

from localdet.scheduling.slots import (
    CPU,
    GPU,
    NVIDIA_DRIVER_GPUS,
    NVIDIA_SMI_QUERY,
    Slot,
    cuda_visible_devices,
    detect_slots,
    read_slot_file,
    slot_table,
    write_slot_file,
)

SMI_OUTPUT = """\
0, GPU-0a1b2c3d-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559
1, GPU-1a1b2c3d-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559
2, GPU-2a1b2c3d-0000-0000-0000-000000000000, NVIDIA RTX A6000, 49140
"""


class FakeRun:
    """Stands in for subprocess.run: answers nvidia-smi and the TensorFlow probe as told,
    and records every command it was asked to run."""

    def __init__(self, smi: str | None = SMI_OUTPUT, smi_code: int = 0,
                 tf_names: list[str] | None = None, smi_raises: Exception | None = None):
        self.smi, self.smi_code, self.smi_raises = smi, smi_code, smi_raises
        self.tf_names = tf_names
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        assert kwargs.get("timeout"), "every probe must have a timeout"
        if argv[0] == "nvidia-smi":
            if self.smi_raises is not None:
                raise self.smi_raises
            if self.smi is None:
                raise FileNotFoundError("nvidia-smi")
            return subprocess.CompletedProcess(argv, self.smi_code, self.smi, "")
        assert argv[:2] == [sys.executable, "-c"] and "list_physical_devices" in argv[2]
        out = "some TensorFlow chatter\n" + json.dumps(self.tf_names or [])
        return subprocess.CompletedProcess(argv, 0, out + "\n", "")

    @property
    def tf_calls(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] != "nvidia-smi"]


def driver_folder(tmp_path, gpus: int = 1):
    folder = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
    folder.mkdir(parents=True)
    for i in range(gpus):
        (folder / f"0000:0{i}:00.0").mkdir()
    return folder


def test_nvidia_smi_output_becomes_one_slot_per_gpu(tmp_path):
    run = FakeRun()
    slots = detect_slots(cpu_slots=3, environ={}, run=run, driver_gpus=tmp_path / "none")
    assert slots == [Slot(0, GPU, "NVIDIA H100 80GB HBM3", 81559, "0"),
                     Slot(1, GPU, "NVIDIA H100 80GB HBM3", 81559, "1"),
                     Slot(2, GPU, "NVIDIA RTX A6000", 49140, "2")]
    assert run.calls == [NVIDIA_SMI_QUERY]


def test_a_name_with_commas_and_memory_not_available_are_read(tmp_path):
    run = FakeRun(smi="0, GPU-x, Odd, Name, [N/A]\n")
    assert detect_slots(environ={}, run=run, driver_gpus=tmp_path / "none") == [
        Slot(0, GPU, "Odd, Name", None, "0")]


def test_cuda_visible_devices_limits_the_gpus_in_its_order(tmp_path):
    run = FakeRun()
    slots = detect_slots(environ={"CUDA_VISIBLE_DEVICES": "2,0"}, run=run,
                         driver_gpus=tmp_path / "none")
    assert [(s.index, s.name, s.device) for s in slots] == [
        (0, "NVIDIA RTX A6000", "2"), (1, "NVIDIA H100 80GB HBM3", "0")]


def test_cuda_visible_devices_by_uuid_and_up_to_the_first_unknown_entry(tmp_path):
    run = FakeRun()
    slots = detect_slots(environ={"CUDA_VISIBLE_DEVICES": "GPU-1a1b,7,0"}, run=run,
                         driver_gpus=tmp_path / "none")
    assert [(s.index, s.device) for s in slots] == [(0, "GPU-1a1b")]  # CUDA stops at "7"


def test_cuda_visible_devices_hiding_every_gpu_gives_cpu_slots(tmp_path):
    for hidden in ("", "-1"):
        run = FakeRun()
        slots = detect_slots(cpu_slots=2, environ={"CUDA_VISIBLE_DEVICES": hidden}, run=run,
                             driver_gpus=driver_folder(tmp_path / hidden.strip("-") / "x"))
        assert slots == [Slot(0, CPU, "CPU"), Slot(1, CPU, "CPU")]
        assert run.tf_calls == []


def test_no_gpu_and_no_driver_gives_cpu_slots_without_asking_tensorflow(tmp_path):
    for run in (FakeRun(smi=None), FakeRun(smi="", smi_code=9),
                FakeRun(smi_raises=subprocess.TimeoutExpired("nvidia-smi", 20))):
        slots = detect_slots(cpu_slots=4, environ={}, run=run, driver_gpus=tmp_path / "absent")
        assert slots == [Slot(i, CPU, "CPU", None, None) for i in range(4)]
        assert run.calls == [NVIDIA_SMI_QUERY]  # nothing else was started


def test_an_empty_driver_folder_does_not_ask_tensorflow(tmp_path):
    empty = tmp_path / "gpus"
    empty.mkdir()
    run = FakeRun(smi=None, tf_names=["should not be asked"])
    assert detect_slots(environ={}, run=run, driver_gpus=empty) == [Slot(0, CPU, "CPU")]
    assert run.tf_calls == []


def test_with_the_driver_but_no_nvidia_smi_tensorflow_is_asked_in_a_subprocess(tmp_path):
    run = FakeRun(smi=None, tf_names=["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"])
    slots = detect_slots(cpu_slots=1, environ={}, run=run, driver_gpus=driver_folder(tmp_path))
    assert slots == [Slot(0, GPU, "NVIDIA A100-SXM4-40GB", None, "0"),
                     Slot(1, GPU, "NVIDIA A100-SXM4-40GB", None, "1")]
    assert len(run.tf_calls) == 1
    # TensorFlow numbers the visible GPUs; the trial must be given the daemon's names for them.
    run = FakeRun(smi=None, tf_names=["NVIDIA A100-SXM4-40GB"])
    slots = detect_slots(environ={"CUDA_VISIBLE_DEVICES": "3"}, run=run,
                         driver_gpus=driver_folder(tmp_path / "again"))
    assert [(s.kind, s.device) for s in slots] == [(GPU, "3")]


def test_tensorflow_seeing_no_gpu_gives_cpu_slots(tmp_path):
    run = FakeRun(smi=None, tf_names=[])
    assert detect_slots(cpu_slots=2, environ={}, run=run,
                        driver_gpus=driver_folder(tmp_path)) == [Slot(0, CPU, "CPU"),
                                                                 Slot(1, CPU, "CPU")]
    assert len(run.tf_calls) == 1


def test_on_this_machine_without_the_driver_only_nvidia_smi_is_tried():
    """The real call, as the daemon makes it."""
    calls = []

    def recording_run(argv, **kwargs):
        calls.append(list(argv))
        return subprocess.run(argv, check=False, **kwargs)

    slots = detect_slots(cpu_slots=2, run=recording_run)
    assert slots and [s.index for s in slots] == list(range(len(slots)))
    if not NVIDIA_DRIVER_GPUS.exists():
        assert calls == [NVIDIA_SMI_QUERY]
        assert slots == [Slot(0, CPU, "CPU"), Slot(1, CPU, "CPU")]


def test_cuda_visible_devices_for_a_trial():
    gpus = [Slot(0, GPU, "A", 1, "0"), Slot(1, GPU, "A", 1, "3"), Slot(2, GPU, "A", 1, "GPU-ab")]
    assert cuda_visible_devices(gpus) == "0,3,GPU-ab"
    assert cuda_visible_devices(gpus[1:2]) == "3"
    assert cuda_visible_devices([Slot(0, CPU, "CPU"), Slot(1, CPU, "CPU")]) == ""
    assert cuda_visible_devices([]) == ""


def test_slot_file_round_trip(tmp_path):
    path = tmp_path / "home" / "slots.json"
    assert read_slot_file(path) is None
    slots = [Slot(0, GPU, "NVIDIA H100 80GB HBM3", 81559, "0"), Slot(1, GPU, "B", None, "2")]
    write_slot_file(path, slots)
    assert read_slot_file(path) == slots
    write_slot_file(path, [Slot(0, CPU, "CPU")])
    assert read_slot_file(path) == [Slot(0, CPU, "CPU")]
    assert [p.name for p in path.parent.iterdir()] == ["slots.json"]  # no temporary left
    path.write_text("{not json")
    assert read_slot_file(path) is None


def test_the_slot_table_shows_devices_and_what_runs_there():
    slots = [Slot(0, GPU, "NVIDIA H100 80GB HBM3", 81559, "0"),
             Slot(1, GPU, "NVIDIA RTX A6000", 49140, "2")]
    console = Console(record=True, width=200)
    console.print(slot_table(slots, busy={1: "trial 7 (experiment 2)"}))
    text = console.export_text()
    assert "NVIDIA H100 80GB HBM3" in text and "NVIDIA RTX A6000" in text
    assert "79.6 GiB" in text and "48.0 GiB" in text
    row_of = {line.split("│")[1].strip(): line for line in text.splitlines()
              if line.count("│") > 2 and line.split("│")[1].strip().isdigit()}
    assert "trial 7 (experiment 2)" in row_of["1"] and "idle" in row_of["0"]
    assert "2 GPUs" in text


def test_the_slot_table_for_cpu_slots():
    console = Console(record=True, width=200)
    console.print(slot_table([Slot(0, CPU, "CPU"), Slot(1, CPU, "CPU")]))
    text = console.export_text()
    assert "2 CPU slots" in text and text.count("idle") == 2


def test_a_mig_instance_in_cuda_visible_devices_is_one_gpu_slot(tmp_path):
    mig = "MIG-4b1e1c2f-0000-0000-0000-000000000000"
    slots = detect_slots(environ={"CUDA_VISIBLE_DEVICES": mig}, run=FakeRun(),
                         driver_gpus=tmp_path / "none")
    assert [(s.kind, s.device) for s in slots] == [(GPU, mig)]
    assert cuda_visible_devices(slots) == mig
