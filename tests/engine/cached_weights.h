// A WeightSource decorator that memoizes loads, so tests that run many layers on one model
// generate (or read) each expert once.
#pragma once

#include <map>
#include <mutex>
#include <utility>

#include "engine/weights.h"

namespace gcmoe::engine::testing_util {

class CachedWeights final : public WeightSource {
 public:
  explicit CachedWeights(const WeightSource& inner) : inner_(inner) {}

  const ModelSpec& spec() const override { return inner_.spec(); }
  std::string Describe() const override { return inner_.Describe(); }
  Result<ExpertWeights> LoadExpert(int layer, int expert) const override {
    return Memo(experts_, {layer, expert}, [&] { return inner_.LoadExpert(layer, expert); });
  }
  Result<SharedExpertWeights> LoadShared(int layer) const override {
    return Memo(shared_, {layer, -1}, [&] { return inner_.LoadShared(layer); });
  }
  Result<DenseExpertWeights> LoadExpertDense(int layer, int expert) const override {
    return Memo(dense_, {layer, expert}, [&] { return inner_.LoadExpertDense(layer, expert); });
  }
  Result<DenseExpertWeights> LoadSharedDense(int layer) const override {
    return Memo(dense_, {layer, -1}, [&] { return inner_.LoadSharedDense(layer); });
  }
  Status CheckExperts(const std::vector<int>& layers,
                      const std::vector<int>& experts) const override {
    return inner_.CheckExperts(layers, experts);
  }

 private:
  using Key = std::pair<int, int>;  // (layer, expert), expert -1 = shared

  template <typename T, typename Load>
  Result<T> Memo(std::map<Key, T>& cache, Key key, Load load) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Result<T> loaded = load();
    if (loaded.ok()) cache.emplace(key, *loaded);
    return loaded;
  }

  const WeightSource& inner_;
  mutable std::mutex mu_;
  mutable std::map<Key, ExpertWeights> experts_;
  mutable std::map<Key, SharedExpertWeights> shared_;
  mutable std::map<Key, DenseExpertWeights> dense_;
};

}  // namespace gcmoe::engine::testing_util
