// zeroplan probe: the alpha-beta fit against closed forms, the peak estimate from /proc/cpuinfo text,
// and one --quick probe of this machine with 2 Gloo ranks (this binary is its own collectives worker).
#include "zeroplan/exec/probe.h"
#include "zeroplan/exec/shm_communicator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan::exec {
namespace {

// Before gtest: started by probe_cluster as a collectives worker, be one and exit.
const bool kWorkerMain = [] {
  if (!is_collectives_worker()) return false;
  const int code = run_collectives_worker();
  std::fflush(nullptr);
  std::_Exit(code);
}();

std::vector<std::pair<double, double>> line(double alpha, double beta, const std::vector<double>& bytes) {
  std::vector<std::pair<double, double>> points;
  for (double b : bytes) points.emplace_back(b, alpha + beta * b);
  return points;
}

const std::vector<double> kBytes = {4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20};

TEST(FitAlphaBeta, RecoversExactLine) {
  for (const auto& [alpha, beta] : {std::pair{25e-6, 1.0 / 2e9}, std::pair{1e-3, 1.0 / 50e9}, std::pair{3e-6, 1e-8}}) {
    const AlphaBetaFit f = fit_alpha_beta(line(alpha, beta, kBytes));
    EXPECT_NEAR(f.alpha_s, alpha, alpha * 1e-9);
    EXPECT_NEAR(f.beta_s_per_byte, beta, beta * 1e-9);
    EXPECT_LT(f.residual, 1e-12);
  }
}

TEST(FitAlphaBeta, TwoPointsAreInterpolated) {
  const AlphaBetaFit f = fit_alpha_beta({{1000, 2e-5}, {3000, 4e-5}});
  EXPECT_NEAR(f.alpha_s, 1e-5, 1e-15);
  EXPECT_NEAR(f.beta_s_per_byte, 1e-8, 1e-18);
}

TEST(FitAlphaBeta, WeighsRelativeErrorAndReportsIt) {
  // +10% on the smallest size and -10% on the largest: the relative RMS residual is the error of the
  // fit against those points, and the fit stays near the line at both ends.
  auto points = line(20e-6, 1e-9, kBytes);
  points.front().second *= 1.1;
  points.back().second *= 0.9;
  const AlphaBetaFit f = fit_alpha_beta(points);
  EXPECT_GT(f.residual, 0.01);
  EXPECT_LT(f.residual, 0.1);
  EXPECT_NEAR(f.alpha_s, 20e-6, 20e-6 * 0.15);
  EXPECT_NEAR(f.beta_s_per_byte, 1e-9, 1e-9 * 0.15);
  double sq = 0;
  for (const auto& [b, t] : points) sq += std::pow((f.alpha_s + f.beta_s_per_byte * b - t) / t, 2);
  EXPECT_NEAR(f.residual, std::sqrt(sq / static_cast<double>(points.size())), 1e-12);
}

TEST(FitAlphaBeta, ClampsNegativeAlphaAndBeta) {
  // A line through negative latency: fitted through the origin instead.
  const AlphaBetaFit through_origin = fit_alpha_beta(line(-5e-6, 1e-9, {1e5, 1e6, 1e7}));
  EXPECT_EQ(through_origin.alpha_s, 0);
  EXPECT_GT(through_origin.beta_s_per_byte, 0);
  // Times that fall with size: a constant.
  const AlphaBetaFit constant = fit_alpha_beta({{1e3, 3e-5}, {1e6, 2e-5}});
  EXPECT_EQ(constant.beta_s_per_byte, 0);
  EXPECT_GT(constant.alpha_s, 2e-5);
  EXPECT_LT(constant.alpha_s, 3e-5);
  // One size: a constant, exact.
  const AlphaBetaFit one = fit_alpha_beta({{4096, 7e-5}});
  EXPECT_NEAR(one.alpha_s, 7e-5, 1e-18);
  EXPECT_EQ(one.beta_s_per_byte, 0);
  EXPECT_LT(one.residual, 1e-12);
}

TEST(EstimatePeak, FromCpuinfoText) {
  const std::string avx512 =
      "processor\t: 0\nmodel name\t: Xeon\ncpu MHz\t\t: 2500.000\nflags\t\t: fpu sse avx avx2 fma avx512f\n";
  std::string how;
  const auto peak = estimate_peak_fp32_flops(avx512, 2, &how);
  ASSERT_TRUE(peak.has_value());
  EXPECT_DOUBLE_EQ(*peak, 2 * 2.5e9 * 16 * 2 * 2);
  EXPECT_NE(how.find("avx512f"), std::string::npos) << how;
  const auto avx2 = estimate_peak_fp32_flops("cpu MHz : 3000\nflags : sse avx avx2 fma\n", 1, nullptr);
  ASSERT_TRUE(avx2.has_value());
  EXPECT_DOUBLE_EQ(*avx2, 3e9 * 8 * 2 * 2);
  EXPECT_FALSE(estimate_peak_fp32_flops("processor : 0\nBogoMIPS : 100\n", 1, nullptr).has_value());
}

// Every numeric leaf path of a JSON document ("device.peak_flops.fp32", "collectives[0].alpha_s").
void numeric_paths(const nlohmann::json& j, const std::string& path, std::vector<std::string>& out) {
  if (j.is_number()) out.push_back(path);
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      numeric_paths(it.value(), path.empty() ? it.key() : path + "." + it.key(), out);
  if (j.is_array())
    for (std::size_t i = 0; i < j.size(); ++i) numeric_paths(j[i], path + "[" + std::to_string(i) + "]", out);
}

// The provenance entry covering `path` (itself or its nearest ancestor), or nullptr.
const Provenance* covering(const ClusterProfile& c, std::string path) {
  for (;;) {
    if (auto it = c.provenance.find(path); it != c.provenance.end()) return &it->second;
    const auto cut = path.find_last_of(".[");
    if (cut == std::string::npos) return nullptr;
    path = path.substr(0, cut);
  }
}

TEST(Probe, QuickRunOnThisMachine) {
  namespace fs = std::filesystem;
  ProbeOptions o;
  o.set_quick(true).set_world_sizes({2});
  o.worker_argv = {"exec_probe_test"};  // this binary; kWorkerMain makes it a worker
  o.worker_timeout = std::chrono::seconds(60);
  std::vector<std::string> lines;
  o.progress = [&](const std::string& l) { lines.push_back(l); };
  const auto t0 = std::chrono::steady_clock::now();
  const ClusterProfile c = probe_cluster(o);
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took_s, 120);  // the full probe's promise; --quick takes seconds on an idle machine
  // machine, memory, GEMM, copies, optimizer, collectives on 2 ranks, compute with 2 ranks at once
  EXPECT_EQ(lines.size(), 7u);
  // How ranks, compute and collectives slow each other on the shared cores: factors >= 1, recorded with
  // their provenance when any is above 1; calibration is left to autopilot --calibrate.
  for (double f : {c.core_contention.compute_ranks_slowdown, c.core_contention.compute_with_comm_slowdown,
                   c.core_contention.comm_with_compute_slowdown})
    EXPECT_GE(f, 1.0);
  EXPECT_EQ(c.core_contention.measured(), c.provenance.contains("core_contention"));
  EXPECT_EQ(c.calibration, Calibration{});

  EXPECT_NO_THROW(validate(c));
  EXPECT_TRUE(c.shares_cores);
  EXPECT_EQ(c.device.kind, "cpu");
  EXPECT_EQ(c.devices_per_node, 2);
  EXPECT_GE(c.host.cores, 1);
  EXPECT_GT(c.device.mem_bytes, 0);
  EXPECT_LE(c.device.mem_bytes * 2, c.host.mem_bytes);
  EXPECT_GT(c.device.peak_flops.at("fp32"), 1e8);
  EXPECT_GT(c.device.compute_efficiency, 0);
  EXPECT_LE(c.device.compute_efficiency, 1);
  for (double bw :
       {c.device.mem_bw_bytes_per_s, c.host.bw_d2h_pinned_bytes_per_s, c.host.bw_h2d_pinned_bytes_per_s,
        c.host.bw_d2h_pageable_bytes_per_s, c.host.bw_h2d_pageable_bytes_per_s, c.host.memcpy_bw_bytes_per_s,
        c.links.intra_node.bw_bytes_per_s, c.links.inter_node.bw_bytes_per_s, c.links.pcie.bw_bytes_per_s}) {
    EXPECT_GT(bw, 1e8);  // 100 MB/s: anything slower is a broken measurement
  }
  EXPECT_GT(c.device.launch_overhead_s, 0);
  EXPECT_LT(c.device.launch_overhead_s, 1e-3);
  for (const OptimizerRate& r : {c.host.optimizer.adam, c.host.optimizer.sgd}) {
    EXPECT_GT(r.per_tensor_params_per_s, 1e6);
    EXPECT_GT(r.flat_params_per_s, 1e6);
  }

  // One fit per collective the executor uses, on 2 ranks, over the sizes measured.
  std::set<std::string> ops;
  for (std::size_t i = 0; i < c.collectives.size(); ++i) {
    const CollectiveFit& f = c.collectives[i];
    ops.insert(f.op);
    EXPECT_EQ(f.backend, cpu_backend(true));  // "shm": the probe's ranks share this machine
    EXPECT_EQ(f.algorithm, "ring");
    EXPECT_EQ(f.scope, "intra_node");
    EXPECT_EQ(f.world_sizes, std::vector<int>{2});
    EXPECT_EQ(f.min_bytes, 4096);
    EXPECT_EQ(f.max_bytes, 4 << 20);
    EXPECT_GT(f.alpha_s + f.beta_s_per_byte * f.max_bytes, 0);
    // >= 0: on a loaded 2-core machine (ctest -j2) a quick probe's medians can fall with the size, and the
    // fit clamps a negative slope to 0 (FitAlphaBeta.ClampsNegativeAlphaAndBeta).
    EXPECT_GE(f.beta_s_per_byte, 0) << covering(c, "collectives[" + std::to_string(i) + "]")->citation;
    EXPECT_GE(f.fit_residual, 0);
  }
  EXPECT_EQ(ops, (std::set<std::string>{"all_reduce", "all_gather", "reduce_scatter", "broadcast"}));

  // Provenance for every number, each a probe measurement (or a stated estimate) dated today.
  nlohmann::json j = nlohmann::json::parse(to_json_string(c));
  std::vector<std::string> paths;
  for (const char* key : {"devices_per_node", "device", "host", "links", "collectives", "allocator_overhead_factor"})
    numeric_paths(j.at(key), key, paths);
  EXPECT_GT(paths.size(), 30u);
  const std::regex dated("measured by zeroplan probe on \\d{4}-\\d{2}-\\d{2}: .+");
  for (const std::string& path : paths) {
    const Provenance* p = covering(c, path);
    ASSERT_NE(p, nullptr) << "no provenance for " << path;
    if (p->source == "probe") {
      EXPECT_TRUE(std::regex_match(p->citation, dated)) << path << ": " << p->citation;
    } else {
      EXPECT_EQ(p->source, "estimate") << path;
    }
  }
  EXPECT_EQ(covering(c, "device.mem_bw_bytes_per_s")->source, "probe");
  EXPECT_EQ(covering(c, "collectives[0].alpha_s")->source, "probe");

  // Written and read back as a document; a fresh file is reused, an old one or one without the
  // world size is not.
  const fs::path file = fs::temp_directory_path() / ("zeroplan_probe_test_" + std::to_string(::getpid()) + ".json");
  EXPECT_GE(c.probe_other_load_cores, 0);  // measured, whatever the other tests running beside it did
  EXPECT_NE(c.provenance.find("probe_other_load_cores"), c.provenance.end());
  ClusterProfile quiet = c;
  quiet.probe_other_load_cores = 0;  // as on a quiet machine (the busy case below)
  if (!quiet.core_contention.measured()) {  // no contention measured at all: as if there were some
    quiet.core_contention.comm_with_compute_slowdown = 1.5;
    quiet.provenance["core_contention"] = Provenance{"estimate", "test"};
  }
  write_document(file, quiet);
  EXPECT_EQ(read_document<ClusterProfile>(file), quiet);
  ASSERT_TRUE(fresh_probe(file, std::chrono::seconds(60), {2}).has_value());
  EXPECT_EQ(*fresh_probe(file, std::chrono::seconds(60), {2}), quiet);
  EXPECT_FALSE(fresh_probe(file, std::chrono::seconds(60), {2, 4}).has_value());
  fs::last_write_time(file, fs::file_time_type::clock::now() - std::chrono::seconds(120));
  EXPECT_FALSE(fresh_probe(file, std::chrono::seconds(60), {2}).has_value());
  EXPECT_FALSE(fresh_probe(file.string() + ".missing", std::chrono::seconds(60), {2}).has_value());
  // The probe recorded the load other programs put on the machine while it measured; a probe of a busy
  // machine is not reused (its core-sharing slowdown was the busy machine's).
  ClusterProfile busy = quiet;
  busy.probe_other_load_cores = busy_probe_load_cores(c) + 0.5;
  write_document(file, busy);
  EXPECT_FALSE(fresh_probe(file, std::chrono::seconds(60), {2}).has_value());
  busy.probe_other_load_cores = busy_probe_load_cores(c) / 2;
  write_document(file, busy);
  EXPECT_TRUE(fresh_probe(file, std::chrono::seconds(60), {2}).has_value());
  // A probe from before core contention was measured is probed again.
  ClusterProfile before = quiet;
  before.core_contention = CoreContention{};
  before.provenance.erase("core_contention");
  write_document(file, before);
  EXPECT_FALSE(fresh_probe(file, std::chrono::seconds(60), {2}).has_value());
  fs::remove(file);
}

// probe --device: the GPU probe's measurements, run on the CPU device (the same code times a CUDA device):
// the base file's datasheet numbers stay, what one device can measure is replaced with provenance
// "probe", and each dtype of the base's GEMM tables gets its m = n = k sweep; a device that is not there
// is an ExecError.
TEST(ProbeGpu, MeasuresTheDeviceOverItsBaseFile) {
  const ClusterProfile base = resolve_cluster("h100-sxm-80gb");
  ProbeOptions o;
  o.quick = true;
  o.name = "here";
  const GpuProbe r = probe_gpu(o, base, "cpu");
  const ClusterProfile& c = r.cluster;
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(c.name, "here");
  EXPECT_EQ(c.devices_per_node, 1);
  EXPECT_EQ(c.device.kind, "cuda");  // the base's part: plans simulate as on that GPU
  EXPECT_EQ(c.device.peak_flops, base.device.peak_flops);
  EXPECT_EQ(c.links, base.links);
  EXPECT_EQ(c.device.gemm.tile_m, base.device.gemm.tile_m);
  EXPECT_EQ(c.provenance.at("device.peak_flops.bf16").source, base.provenance.at("device.peak_flops.bf16").source);
  for (const char* path : {"devices_per_node", "host.mem_bytes", "host.cores", "host.memcpy_bw_bytes_per_s",
                           "host.optimizer.adam.flat_params_per_s", "device.mem_bw_achieved_bytes_per_s",
                           "device.launch_overhead_s", "host.bw_h2d_pinned_bytes_per_s", "host.bw_d2h_pinned_bytes_per_s",
                           "host.bw_h2d_pageable_bytes_per_s", "host.bw_d2h_pageable_bytes_per_s"}) {
    ASSERT_TRUE(c.provenance.count(path)) << path;
    EXPECT_EQ(c.provenance.at(path).source, "probe") << path;
  }
  EXPECT_NE(c.device.mem_bw_achieved_bytes_per_s, base.device.mem_bw_achieved_bytes_per_s);
  EXPECT_NE(c.host.cores, base.host.cores);
  EXPECT_GT(c.host.bw_d2h_pageable_bytes_per_s, 0);
  EXPECT_EQ(r.date.size(), 10u);
  ASSERT_EQ(r.gemms.size(), base.device.gemm.efficiency.size());
  for (const auto& [dtype, rates] : r.gemms) {
    ASSERT_EQ(rates.size(), 2u) << dtype;  // the quick sweep: 128 and 256
    EXPECT_EQ(rates[0].m, 128);
    EXPECT_EQ(rates[1].k, 256);
    for (const GemmRate& g : rates) {
      EXPECT_GT(g.flops_per_s, 0) << dtype;
      EXPECT_GE(g.reps, 1) << dtype;
    }
  }
  EXPECT_THROW(probe_gpu(o, base, "cuda:7"), ExecError);
}

TEST(Probe, RejectsWorldSizeBelowTwo) {
  ProbeOptions o;
  o.set_world_sizes({1});
  EXPECT_THROW(probe_cluster(o), ExecError);
}

TEST(Probe, FailingWorkerIsAProbeError) {
  ProbeOptions o;
  o.set_quick(true).set_world_sizes({2});
  o.worker_executable = "/bin/false";  // exits 1 at once
  o.worker_argv = {"false"};
  o.worker_timeout = std::chrono::seconds(20);
  try {
    probe_cluster(o);
    FAIL() << "expected ProbeError";
  } catch (const ProbeError& e) {
    EXPECT_NE(std::string(e.what()).find("collectives on 2 ranks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zeroplan::exec
