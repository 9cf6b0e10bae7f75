// The first measured GPU runs (profiles/data/measured/h100-sxm-80gb-2026-11-27, its README says how they
// were made): every run re-simulated from the profile and the probed cluster of the same H100 machine,
// with the plan the run record carries, and judged by compare(). The bounds are what the simulator
// reached when the runs were checked in; a change to the GPU time or memory model that moves a
// prediction away from these measurements fails here. And hfai's published study, predicted from the
// H100's profile and from a CPU profile with the backward's timeline (cpu-2core-2026-11-28).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/compare.h"
#include "zeroplan/sim/simulate.h"

namespace zeroplan::sim {
namespace {

namespace fs = std::filesystem;

constexpr const char* kH100 = "h100-sxm-80gb-2026-11-27";
constexpr const char* kH200 = "h200-sxm-141gb-2026-11-28";

fs::path measured_dir(const std::string& model, const std::string& machine = kH100) {
  return shipped_data_dir() / "measured" / machine / model;
}

// metric name -> signed relative error, per run file's name.
using RunErrors = std::map<std::string, std::map<std::string, double>>;

// Every run of `model` against its re-simulation.
RunErrors errors(const std::string& model, const std::string& profile_file = "",
                 const std::string& machine = kH100) {
  const fs::path dir = measured_dir(model, machine);
  const auto profile = read_document<ModelProfile>(dir / (profile_file.empty() ? model + ".json" : profile_file));
  const auto cluster = read_document<ClusterProfile>(dir / "cluster.json");
  RunErrors out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("run-", 0) != 0) continue;
    const auto record = read_document<RunRecord>(entry.path());
    const Comparison c = compare(simulate(profile, cluster, record.plan), record);
    for (const auto& m : c.metrics) out[name][m.name] = m.rel_error;
  }
  return out;
}

// hfai's activation-offload study (CPUOffload: ResNet-50, fp32, batch 256, one A100 40GB; measured
// 22.4 / 20.3 / 11.8 / 4.4 GB) as `simulate` predicts it on the shipped a100-sxm-40gb cluster file: the
// device peak at each offload ratio of kHfaiRatios.
constexpr double kHfaiRatios[] = {0.0, 0.1, 0.5, 1.0};
std::vector<std::int64_t> hfai_configuration_peaks(const ModelProfile& profile) {
  const ClusterProfile a100 = resolve_cluster("a100-sxm-40gb");
  std::vector<std::int64_t> peaks;
  for (const double ratio : kHfaiRatios) {
    Plan plan = Plan::default_ddp(1, 256);
    plan.offload.activations_ratio = ratio;
    peaks.push_back(simulate(profile, a100, plan).device.peak_bytes);
  }
  return peaks;
}

// gpt2-large (774M parameters, bf16, batch 4 x 1024 tokens) on one H100, probed and profiled there: the
// step time of every plan (stage 0, stage 1 with the optimizer on the host, the same checkpointed,
// OffloadModel with 2 slices) within 30% (the host optimizer was predicted 2.7x too slow before its
// flat-rate and copy-bandwidth model: +96%), the device peak within 12%. The runs predate the executor's
// unit-by-unit fp32 gradient on the host (they zeroed and filled a full fp32 copy), which the simulator
// now lowers: their optimizer phase holds that extra pass.
TEST(MeasuredH100, Gpt2LargeStepsAndPeaks) {
  const auto runs = errors("gpt2-large");
  ASSERT_EQ(runs.size(), 4u);
  for (const auto& [run, metrics] : runs) {
    SCOPED_TRACE(run);
    ASSERT_TRUE(metrics.contains("step_time_s"));
    // OffloadModel: its measured forward and backward took 2.4-3x the profile's unit times (the slices'
    // copies inside the compute spans) and its host step 30% more than predicted; 35% until modelled.
    EXPECT_LE(std::abs(metrics.at("step_time_s")), run == "run-om2.json" ? 0.35 : 0.30);
    ASSERT_TRUE(metrics.contains("device_peak_bytes.rank0"));
    EXPECT_LE(std::abs(metrics.at("device_peak_bytes.rank0")), 0.12);
  }
}

// Every run's rank-0 device peak within `bound` of the prediction.
void expect_device_peaks_within(const RunErrors& runs, double bound) {
  for (const auto& [run, metrics] : runs) {
    SCOPED_TRACE(run);
    ASSERT_TRUE(metrics.contains("device_peak_bytes.rank0"));
    EXPECT_LE(std::abs(metrics.at("device_peak_bytes.rank0")), bound);
  }
}

// gpt2-small (124M, bf16, batch 4 x 1024) under the GPU kit's nine plans: device peaks within 7%, the
// pinned host blocks (the caching host allocator's) within 25%. Its step times are not judged: 8 steps
// of a launch-bound model spread 66% between p10 and p90, and its cluster was probed before the probe's
// flat optimizer rate left the caches.
TEST(MeasuredH100, Gpt2SmallPeaks) {
  const auto runs = errors("gpt2-small");
  ASSERT_EQ(runs.size(), 9u);
  expect_device_peaks_within(runs, 0.07);
  for (const auto& [run, metrics] : runs) {
    SCOPED_TRACE(run);
    if (metrics.contains("host_reserved_bytes.rank0")) {
      EXPECT_LE(std::abs(metrics.at("host_reserved_bytes.rank0")), 0.25);
    }
  }
}

// hfai's activation-offload study (ResNet-50, fp32, batch 256, ratios 0 / 0.1 / 0.5 / 1) on the H100,
// activation offload one tensor at a time (resnet50-offload-per-tensor): device peaks of ratios 0 and 0.1
// within 2%, 0.5 within 12% (the simulator 11% under). Ratio 1 measured 10.32 GiB against 4.74 predicted:
// the CUDA side lane then kept the tensors of every copy in flight while the compute thread ran ahead of
// the copies (its wait is a host-side wait since: 4.97 GiB on the H200 below), so only the direction is held:
// never predicted above the measured. Step times are not judged: the runs made each batch on the host one
// pixel at a time. And the mark: `simulate` of hfai's own configuration (this profile on an A100
// 40GB cluster file) predicts ratio 1 below 6 GiB, each ratio below the one before.
TEST(MeasuredH100, Resnet50ActivationOffloadPeaks) {
  const auto runs = errors("resnet50-offload-per-tensor", "resnet50-b256.json");
  ASSERT_EQ(runs.size(), 4u);
  const std::map<std::string, double> bound = {
      {"run-r50-act0.json", 0.02}, {"run-r50-act0.1.json", 0.02}, {"run-r50-act0.5.json", 0.12}};
  for (const auto& [run, metrics] : runs) {
    SCOPED_TRACE(run);
    ASSERT_TRUE(metrics.contains("device_peak_bytes.rank0"));
    const double err = metrics.at("device_peak_bytes.rank0");
    if (bound.contains(run)) {
      EXPECT_LE(std::abs(err), bound.at(run));
    } else {
      EXPECT_LE(err, 0.0);
    }
  }
  const auto peaks = hfai_configuration_peaks(
      read_document<ModelProfile>(measured_dir("resnet50-offload-per-tensor") / "resnet50-b256.json"));
  for (size_t i = 1; i < peaks.size(); ++i) EXPECT_LT(peaks[i], peaks[i - 1]) << kHfaiRatios[i];
  EXPECT_LT(peaks.back(), std::int64_t{6} << 30) << "hfai measured 4.4 GB at ratio 1";
}

// The same study on a lent H200 (h200-sxm-141gb-2026-11-28: the GPU kit at 4877938, its profile with the
// GEMM libraries' 33 MiB, the images drawn on the GPU): device peaks measured 21.25 / 19.40 / 12.06 / 4.97
// GiB at ratios 0 / 0.1 / 0.5 / 1, each predicted within 0.5% (hfai: 22.4 / 20.3 / 11.8 / 4.4 GB), ratio 1
// below 6 GiB measured as predicted. Steps within 5% (+0.9 / -0.5 / +1.3 / +2.2%): on a GPU the simulator
// adds a unit's copies out to its forward, as the executor's host-side waits make them (the kit's own
// predictions, before that, were -17.1% at ratio 0.1 and -5.9% at 0.5).
TEST(MeasuredH200, Resnet50ActivationOffloadPeaks) {
  const auto runs = errors("resnet50-offload", "resnet50-b256.json", kH200);
  ASSERT_EQ(runs.size(), 4u);
  expect_device_peaks_within(runs, 0.005);
  for (const auto& [run, metrics] : runs) {
    SCOPED_TRACE(run);
    EXPECT_LE(std::abs(metrics.at("step_time_s")), 0.05);
  }
  const auto record = read_document<RunRecord>(measured_dir("resnet50-offload", kH200) / "run-r50-act1.json");
  EXPECT_LT(record.peaks.at(0).device_peak_bytes, std::int64_t{6} << 30) << "measured at ratio 1";
}

// gpt2-small under the kit's nine plans on the H200: device peaks within 7% as on the H100 (0-5.2% under:
// the checkpointed plans and ratio 1 exact, 0.23 GiB more where the peak is in the loss, not modelled yet).
TEST(MeasuredH200, Gpt2SmallPeaks) {
  const auto runs = errors("gpt2-small", "", kH200);
  ASSERT_EQ(runs.size(), 9u);
  expect_device_peaks_within(runs, 0.07);
}

// The same study from zeroplan's own resnet50 profile with the backward's timeline
// (profiles/data/measured/cpu-2core-2026-11-28, profiled on the CPU at batch 8 and scaled to 256), which
// the H100 documents predate: each ratio predicts less than the one before, ratio 0 within 5% of hfai's
// measured 22.4 GB, and ratio 1 below 6 GiB (issue #33's mark). A change that keeps an offloaded tensor
// on the device longer than its copy out, or brings it back before its unpack's turn, raises ratio 1
// above the mark.
TEST(HfaiStudy, Resnet50AtBatch256OnAnA100FromTheTimeline) {
  const auto profile =
      read_document<ModelProfile>(shipped_data_dir() / "measured" / "cpu-2core-2026-11-28" / "resnet50-b8.json");
  for (const auto& u : profile.units) {
    if (!u.saved_tensors.empty()) {
      EXPECT_FALSE(u.bwd_unpack_order.empty()) << u.name << ": no backward timeline";
    }
  }
  const auto peaks = hfai_configuration_peaks(profile);
  for (size_t i = 0; i < peaks.size(); ++i)
    std::printf("ratio %.1f: device peak predicted %.2f GiB\n", kHfaiRatios[i], double(peaks[i]) / double(1 << 30));
  EXPECT_NEAR(double(peaks[0]), 22.4e9, 0.05 * 22.4e9) << "hfai measured 22.4 GB without offload";
  for (size_t i = 1; i < peaks.size(); ++i) EXPECT_LT(peaks[i], peaks[i - 1]) << kHfaiRatios[i];
  EXPECT_LT(peaks.back(), std::int64_t{6} << 30) << "hfai measured 4.4 GB at ratio 1";
}

}  // namespace
}  // namespace zeroplan::sim
