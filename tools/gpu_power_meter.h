// A GPU's board energy and SM clock while `gcmoe bench layer` replays a step.
//
// Under sustained load the H200 holds its board at the power cap (700 W) by lowering the SM
// clock, so a step's time there is its energy over the cap (docs/PERFORMANCE.md).
// GpuPowerMeter reads NVML's energy counter and clocks; NVML ships with the driver and is loaded
// at run time, so a machine without it only loses these columns. PowerWindow turns the readings
// taken between batches of replays into the average power: NVML updates the energy counter every
// 20-100 ms, so the window runs from the first update it sees to the last.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace gcmoe::tools {

class GpuPowerMeter {
 public:
  // The GPU at `pci_bus_id` (cudaDeviceGetPCIBusId's form); nullptr, with *why set, when NVML or
  // the GPU cannot be opened.
  static std::unique_ptr<GpuPowerMeter> Open(const std::string& pci_bus_id, std::string* why);
  ~GpuPowerMeter();
  GpuPowerMeter(const GpuPowerMeter&) = delete;
  GpuPowerMeter& operator=(const GpuPowerMeter&) = delete;

  // The board's energy since the driver loaded (mJ); false when NVML fails.
  bool EnergyMillijoules(uint64_t* mj) const;
  // The current SM clock (MHz); false when NVML fails.
  bool SmClockMhz(unsigned* mhz) const;
  // The enforced board power limit (W), 0 when NVML cannot tell.
  double PowerLimitWatts() const;

 private:
  struct Api;
  explicit GpuPowerMeter(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

// Average power over the readings of one settling phase: from the first update of the energy
// counter after the first reading to the last update seen.
class PowerWindow {
 public:
  // One reading at host time `seconds`: the energy counter and the SM clock (0 = not read).
  void Add(double seconds, uint64_t energy_mj, unsigned sm_mhz);
  // Watts between the first and the last counter update seen; 0 with fewer than two updates.
  double Watts() const;
  // Mean of the SM clocks read (MHz), 0 when none were.
  double MeanSmMhz() const;

 private:
  bool started_ = false;
  uint64_t last_mj_ = 0;  // the latest reading: the last update's once there was one
  int updates_ = 0;
  double first_s_ = 0, last_s_ = 0;  // when the first and the last update were seen
  uint64_t first_mj_ = 0;
  double mhz_sum_ = 0;
  int mhz_count_ = 0;
};

}  // namespace gcmoe::tools
