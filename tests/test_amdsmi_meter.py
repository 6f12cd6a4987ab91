"""The amdsmi power meter on the CPU, through a fake amdsmi module (both API generations)."""
import math

import pytest

from dmacoll_lab.bench import power
from dmacoll.errors import BackendUnavailable


class FakeSmi:
    """amdsmi as its Python API answers: handles, PCI addresses, energy ticks and power info."""

    def __init__(self, new_api=True, power_info=None):
        self.new_api, self.ticks = new_api, 1000
        self.power_info = power_info if power_info is not None else {"current_socket_power": 310,
                                                                      "average_socket_power": "N/A"}
        self.inits = 0

    def amdsmi_init(self):
        self.inits += 1

    def amdsmi_get_processor_handles(self):
        return ["h0", "h1", "h2"]

    def amdsmi_get_gpu_device_bdf(self, h):
        return {"h0": "0000:0C:00.0", "h1": "0000:22:00.0", "h2": "0000:38:00.0"}[h]

    def amdsmi_get_energy_count(self, h):
        self.ticks += 500
        key = "energy_accumulator" if self.new_api else "power"
        return {key: self.ticks, "counter_resolution": 15.3, "timestamp": 0}

    def amdsmi_get_power_info(self, h):
        return self.power_info


@pytest.mark.parametrize("new_api", [True, False])
def test_energy_counter_in_joules_from_either_api_generation(new_api):
    meter = power.AmdSmiMeter(1, smi=FakeSmi(new_api), bdf="0000:38:00.0")
    assert meter._handle == "h2" and meter.name == "hip:1 (0000:38:00.0)"  # by PCI address, not index
    e0, e1 = meter.energy_j(), meter.energy_j()
    assert e1 - e0 == pytest.approx(500 * 15.3e-6)


def test_power_reads_the_field_this_board_fills():
    assert power.AmdSmiMeter(0, smi=FakeSmi(), bdf=None).power_w() == 310.0  # MI300: average is "N/A"
    assert power.AmdSmiMeter(0, smi=FakeSmi(power_info={"socket_power": 305}), bdf=None).power_w() == 305.0
    assert math.isnan(power.AmdSmiMeter(0, smi=FakeSmi(power_info={"average_socket_power": "N/A"}),
                                        bdf=None).power_w())


def test_index_fallback_and_unknown_pci_address():
    assert power.AmdSmiMeter(2, smi=FakeSmi(), bdf=None)._handle == "h2"
    with pytest.raises(BackendUnavailable, match="no GPU at PCI address 0000:99:00.0"):
        power.AmdSmiMeter(0, smi=FakeSmi(), bdf="0000:99:00.0")


def test_measure_works_with_the_amd_meter():
    meter = power.AmdSmiMeter(0, smi=FakeSmi(), bdf=None)
    run = power.measure(meter, lambda: None, steps=3, step=lambda: 2)
    assert run["calls"] == 6 and run["energy_j"] == pytest.approx(500 * 15.3e-6)
