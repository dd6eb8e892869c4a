#include "tools/gpu_power_meter.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>
#include <utility>

namespace gcmoe::tools {

// The few NVML entry points used, by their documented C signatures (nvmlReturn_t is an int,
// 0 = success; nvmlDevice_t an opaque pointer; NVML_CLOCK_SM = 1).
struct GpuPowerMeter::Api {
  using Device = void*;
  void* library = nullptr;
  bool initialized = false;
  Device device = nullptr;
  int (*shutdown)() = nullptr;
  int (*energy)(Device, unsigned long long*) = nullptr;
  int (*clock)(Device, int, unsigned*) = nullptr;
  int (*limit)(Device, unsigned*) = nullptr;
  static constexpr int kClockSm = 1;
  ~Api() {
    if (initialized) shutdown();
    if (library != nullptr) dlclose(library);
  }
};

std::unique_ptr<GpuPowerMeter> GpuPowerMeter::Open(const std::string& pci_bus_id,
                                                   std::string* why) {
  auto api = std::make_unique<Api>();  // closes what it opened on every return below
  api->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api->library == nullptr) {
    *why = "NVML (libnvidia-ml.so.1) not found";
    return nullptr;
  }
  auto resolve = [&](const char* name, auto* fn) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(api->library, name));
    return *fn != nullptr;
  };
  int (*init)() = nullptr;
  int (*by_bus)(const char*, Api::Device*) = nullptr;
  if (!resolve("nvmlInit_v2", &init) || !resolve("nvmlShutdown", &api->shutdown) ||
      !resolve("nvmlDeviceGetHandleByPciBusId_v2", &by_bus) ||
      !resolve("nvmlDeviceGetTotalEnergyConsumption", &api->energy) ||
      !resolve("nvmlDeviceGetClockInfo", &api->clock) ||
      !resolve("nvmlDeviceGetEnforcedPowerLimit", &api->limit)) {
    *why = "NVML lacks an entry point this meter needs";
    return nullptr;
  }
  if (const int rc = init(); rc != 0) {
    *why = "nvmlInit_v2 returned " + std::to_string(rc);
    return nullptr;
  }
  api->initialized = true;
  if (const int rc = by_bus(pci_bus_id.c_str(), &api->device); rc != 0) {
    *why = "NVML has no GPU at " + pci_bus_id + " (" + std::to_string(rc) + ")";
    return nullptr;
  }
  unsigned long long mj = 0;
  if (const int rc = api->energy(api->device, &mj); rc != 0) {
    *why = "NVML cannot read this GPU's energy counter (" + std::to_string(rc) + ")";
    return nullptr;
  }
  return std::unique_ptr<GpuPowerMeter>(new GpuPowerMeter(std::move(api)));
}

GpuPowerMeter::GpuPowerMeter(std::unique_ptr<Api> api) : api_(std::move(api)) {}

GpuPowerMeter::~GpuPowerMeter() = default;

bool GpuPowerMeter::EnergyMillijoules(uint64_t* mj) const {
  unsigned long long value = 0;
  if (api_->energy(api_->device, &value) != 0) return false;
  *mj = value;
  return true;
}

bool GpuPowerMeter::SmClockMhz(unsigned* mhz) const {
  return api_->clock(api_->device, Api::kClockSm, mhz) == 0;
}

double GpuPowerMeter::PowerLimitWatts() const {
  unsigned milliwatts = 0;
  return api_->limit(api_->device, &milliwatts) == 0 ? milliwatts / 1000.0 : 0.0;
}

void PowerWindow::Add(double seconds, uint64_t energy_mj, unsigned sm_mhz) {
  if (sm_mhz > 0) {
    mhz_sum_ += sm_mhz;
    ++mhz_count_;
  }
  if (!started_) {
    started_ = true;
    last_mj_ = energy_mj;
    return;
  }
  if (energy_mj == last_mj_) return;
  last_mj_ = energy_mj;
  if (++updates_ == 1) {
    first_s_ = seconds;
    first_mj_ = energy_mj;
  }
  last_s_ = seconds;
}

double PowerWindow::Watts() const {
  if (updates_ < 2 || last_s_ <= first_s_) return 0.0;
  return static_cast<double>(last_mj_ - first_mj_) / 1000.0 / (last_s_ - first_s_);
}

double PowerWindow::MeanSmMhz() const { return mhz_count_ > 0 ? mhz_sum_ / mhz_count_ : 0.0; }

}  // namespace gcmoe::tools
