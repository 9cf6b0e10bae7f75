// Models, clusters and fake evaluators for the tuner tests and benchmark.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "analytic_gpt.h"
#include "zeroplan/profiles/analytic.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/tuner/evaluator.h"

namespace zeroplan::tuner::testing {

using fixtures::with_embedding_flops;

// A small GPT (analytic): `layers` blocks of hidden 256, 4 heads, sequence 128, vocabulary 1000.
inline ModelProfile small_gpt(int layers = 4, std::int64_t hidden = 256) {
  return with_embedding_flops(analytic_gpt(fixtures::gpt_options(layers, hidden, 4, 128, 1000, "fp32", "gpt-small")));
}

// `nodes` x 8 A100-80GB from the shipped profile, device memory optionally shrunk (to make plans tight).
inline ClusterProfile a100(int nodes, std::int64_t device_mem_bytes = 0) {
  ClusterProfile c = resolve_cluster("a100-sxm-80gb:" + std::to_string(nodes));
  if (device_mem_bytes > 0) c.device.mem_bytes = device_mem_bytes;
  return c;
}

// Golden files: tests/tuner/golden/NAME, rewritten instead of compared when ZEROPLAN_UPDATE_GOLDEN=1
// (tests/tuner/update_golden.sh).
inline std::filesystem::path golden_dir() {
  const char* src = std::getenv("ZEROPLAN_SOURCE_DIR");
  return std::filesystem::path(src ? src : ZEROPLAN_TEST_SOURCE_DIR) / "tests" / "tuner" / "golden";
}

inline void expect_golden(const std::string& name, const std::string& actual) {
  const std::filesystem::path file = golden_dir() / name;
  const char* update = std::getenv("ZEROPLAN_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << actual;
    return;
  }
  std::ifstream in(file, std::ios::binary);
  ASSERT_TRUE(in) << "missing golden file " << file << " (run tests/tuner/update_golden.sh)";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), actual) << "differs from " << file << " (tests/tuner/update_golden.sh regenerates it)";
}

// Wraps an evaluator and counts calls.
class CountingEvaluator final : public Evaluator {
 public:
  explicit CountingEvaluator(const Evaluator& inner) : inner_(inner) {}
  Prediction simulate(const Plan& plan) const override {
    ++simulations;
    return inner_.simulate(plan);
  }
  MemoryBytes memory_lower_bound(const Plan& plan) const override {
    ++bounds;
    return inner_.memory_lower_bound(plan);
  }
  mutable std::atomic<int> simulations{0};
  mutable std::atomic<int> bounds{0};

 private:
  const Evaluator& inner_;
};

}  // namespace zeroplan::tuner::testing
