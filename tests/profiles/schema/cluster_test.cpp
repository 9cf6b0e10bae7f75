#include "zeroplan/profiles/cluster.h"

#include <cstdlib>

#include "schema_test_util.h"

namespace zeroplan {
namespace {

using testing::expect_error;
using testing::expect_error_containing;
using testing::TempDir;
using testing::write_file;

const char* const kShipped[] = {"a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "v100-sxm2-32gb"};

ClusterProfile a100() { return resolve_cluster("a100-sxm-80gb"); }

TEST(Cluster, ShippedListAndDescriptions) {
  const std::vector<ShippedCluster> list = list_shipped_clusters();
  ASSERT_EQ(list.size(), std::size(kShipped));
  for (std::size_t i = 0; i < list.size(); ++i) {
    EXPECT_EQ(list[i].name, kShipped[i]);
    EXPECT_FALSE(list[i].description.empty());
    EXPECT_EQ(list[i].description.find('\n'), std::string::npos);
  }
}

// Every shipped file loads, validates (which checks provenance for every number), is written in
// canonical form, and cites a source for each number.
TEST(Cluster, ShippedFilesLoadWithProvenanceForEveryNumber) {
  for (const char* name : kShipped) {
    SCOPED_TRACE(name);
    const std::filesystem::path file = shipped_clusters_dir() / (std::string(name) + ".json");
    const ClusterProfile c = read_document<ClusterProfile>(file);
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(c.nodes, 1);
    EXPECT_EQ(c.devices_per_node, 8);
    EXPECT_EQ(c.device.kind, "cuda");
    EXPECT_FALSE(c.shares_cores);
    // A file that extends another (h200 over h100) holds only what differs; the others are canonical.
    if (testing::read_file(file).find("\"extends\"") == std::string::npos) {
      EXPECT_EQ(to_json_string(c), testing::read_file(file)) << "not in canonical form";
    }
    for (const auto& [path, p] : c.provenance) {
      if (p.source == "datasheet" || p.source == "paper" || p.source == "microbenchmark") {
        EXPECT_NE(p.citation.find("https://"), std::string::npos) << path;
      }
    }
  }
}

TEST(Cluster, DatasheetValues) {
  const ClusterProfile a80 = a100();
  EXPECT_EQ(a80.device.peak_flops.at("fp32"), 19.5e12);
  EXPECT_EQ(a80.device.peak_flops.at("tf32"), 156e12);
  EXPECT_EQ(a80.device.peak_flops.at("fp16"), 312e12);
  EXPECT_EQ(a80.device.peak_flops.at("bf16"), 312e12);
  EXPECT_EQ(a80.device.mem_bw_bytes_per_s, 2039e9);
  EXPECT_EQ(a80.device.mem_bytes, 80LL << 30);
  // NVLink: nccl-tests busbw (SOURCES.md), below the datasheet's 300 GB/s per direction (600 both ways).
  EXPECT_EQ(a80.links.intra_node.bw_bytes_per_s, 200e9);
  EXPECT_EQ(resolve_cluster("a100-sxm-40gb").device.mem_bw_bytes_per_s, 1555e9);
  const ClusterProfile h = resolve_cluster("h100-sxm-80gb");
  EXPECT_EQ(h.device.peak_flops.at("fp32"), 67e12);
  EXPECT_EQ(h.device.peak_flops.at("tf32"), 494.7e12);
  EXPECT_EQ(h.device.peak_flops.at("bf16"), 989.4e12);
  EXPECT_EQ(h.device.mem_bw_bytes_per_s, 3.35e12);
  EXPECT_EQ(h.links.intra_node.bw_bytes_per_s, 370e9);  // busbw of the 450 GB/s per direction (900 both ways)
  const ClusterProfile v = resolve_cluster("v100-sxm2-32gb");
  EXPECT_EQ(v.device.peak_flops.at("fp32"), 15.7e12);
  EXPECT_EQ(v.device.peak_flops.at("fp16"), 125e12);
  EXPECT_EQ(v.device.peak_flops.count("bf16"), 0u);
  EXPECT_EQ(v.device.mem_bw_bytes_per_s, 900e9);
  EXPECT_EQ(v.links.intra_node.bw_bytes_per_s, 150e9);  // 300 GB/s both directions
}

TEST(Cluster, RoundTrip) {
  ClusterProfile c = a100();
  c.collectives.push_back(CollectiveFit{"all_reduce", "nccl", "ring", "intra_node", {2, 4, 8}, 1.2e-5, 3.4e-12, 0.03,
                                        1024, 1LL << 30, "", {}});
  // A 16-bit fit with its measured points (the probe's): both survive the round trip.
  c.collectives.push_back(CollectiveFit{"all_reduce", "nccl", "ring", "intra_node", {2}, 2e-5, 5e-12, 0.05, 1024,
                                        1 << 20, "bf16", {{1024, 2.5e-5}, {1 << 20, 6e-5}}});
  c.provenance["collectives"] = Provenance{"probe", "measured by zeroplan probe on 2025-01-31"};
  validate(c);
  testing::expect_round_trip(c);
  c.calibration = Calibration{1.25, 2.5};
  std::erase_if(c.provenance, [](const auto& kv) { return kv.first.rfind("calibration.", 0) == 0; });
  c.provenance["calibration"] = Provenance{"calibration", "fitted by zeroplan autopilot --calibrate on 7 runs"};
  validate(c);
  testing::expect_round_trip(c);
}

// core_contention: absent (all 1) in every file written before it and not written then; written with
// its provenance when measured; each factor in [1, 100].
TEST(Cluster, CoreContentionIsOptional) {
  ClusterProfile c = a100();
  EXPECT_FALSE(nlohmann::json(c).contains("core_contention"));
  c.core_contention = CoreContention{1.05, 1.3, 1.8};
  expect_error([&] { validate(c); }, "cluster: no provenance for core_contention.compute_ranks_slowdown");
  c.provenance["core_contention"] = Provenance{"probe", "measured by zeroplan probe on 2026-11-25: test"};
  validate(c);
  testing::expect_round_trip(c);
  EXPECT_EQ(nlohmann::json(c)["core_contention"]["compute_with_comm_slowdown"].get<double>(), 1.3);
  c.core_contention.compute_with_comm_slowdown = 0.9;
  expect_error([&] { validate(c); }, "cluster: core_contention.compute_with_comm_slowdown must be in [1, 100] (got 0.9)");
}

TEST(Cluster, SpecWithNodes) {
  const ClusterProfile c = resolve_cluster("a100-sxm-80gb:128");
  EXPECT_EQ(c.nodes, 128);
  EXPECT_EQ(c.world_size(), 1024);
  EXPECT_EQ(c.name, "a100-sxm-80gb:128");
  const ClusterProfile path = resolve_cluster((shipped_clusters_dir() / "h100-sxm-80gb.json").string() + ":2");
  EXPECT_EQ(path.nodes, 2);
  EXPECT_EQ(path.name, "h100-sxm-80gb:2");
  expect_error([] { resolve_cluster("a100-sxm-80gb:0"); },
               "cluster: bad cluster spec \"a100-sxm-80gb:0\": node count 0 must be in 1..999999");
  expect_error([] { resolve_cluster("a100-sxm-80gb:x"); },
               "cluster: bad cluster spec \"a100-sxm-80gb:x\": expected NAME, PATH, NAME:NODES or PATH:NODES");
  expect_error([] { resolve_cluster(""); }, "cluster: empty cluster spec");
}

TEST(Cluster, UnknownNameListsShipped) {
  expect_error([] { resolve_cluster("a100-sxm-80g:4"); },
               "cluster: unknown cluster \"a100-sxm-80g\" (did you mean \"a100-sxm-80gb\"?); shipped: a100-sxm-40gb, "
               "a100-sxm-80gb, h100-sxm-80gb, h200-sxm-141gb, v100-sxm2-32gb; or give a path to a .json file");
  expect_error_containing([] { resolve_cluster("no/such/file.json"); }, "no/such/file.json: cannot open");
}

TEST(Cluster, ExtendsShippedName) {
  TempDir dir;
  write_file(dir.path() / "big.json", R"({"schema": "zeroplan.cluster/1", "extends": "a100-sxm-80gb", "nodes": 128})");
  const ClusterProfile c = read_document<ClusterProfile>(dir.path() / "big.json");
  ClusterProfile expected = a100();
  expected.nodes = 128;
  expected.name = "a100-sxm-80gb:128";
  EXPECT_TRUE(c == expected);
  // The same through a spec, with the node count overridden again.
  EXPECT_EQ(resolve_cluster((dir.path() / "big.json").string() + ":4").name, "a100-sxm-80gb:4");
}

TEST(Cluster, ExtendsPathOverridesAndMarksEstimates) {
  TempDir dir;
  write_file(dir.path() / "base.json", testing::read_file(shipped_clusters_dir() / "h100-sxm-80gb.json"));
  std::filesystem::create_directories(dir.path() / "sub");
  write_file(dir.path() / "sub" / "mine.json", R"({
    "schema": "zeroplan.cluster/1", "extends": "../base.json", "name": "my-h100",
    "host": {"bw_h2d_pinned_bytes_per_s": 5.1e10, "cores": 96},
    "provenance": {"host.cores": {"source": "probe", "citation": "lscpu on 2025-02-01"}}})");
  const ClusterProfile c = read_document<ClusterProfile>(dir.path() / "sub" / "mine.json");
  EXPECT_EQ(c.name, "my-h100");
  EXPECT_EQ(c.host.bw_h2d_pinned_bytes_per_s, 5.1e10);
  EXPECT_EQ(c.host.cores, 96);
  EXPECT_EQ(c.host.mem_bytes, 2048LL << 30);  // kept from the base
  EXPECT_EQ(c.provenance.at("host.cores").source, "probe");
  EXPECT_EQ(c.provenance.at("host.bw_h2d_pinned_bytes_per_s").source, "estimate");
  EXPECT_NE(c.provenance.at("host.bw_h2d_pinned_bytes_per_s").citation.find("mine.json"), std::string::npos);
}

TEST(Cluster, ExtendsErrors) {
  TempDir dir;
  write_file(dir.path() / "a.json", R"({"schema": "zeroplan.cluster/1", "extends": "b.json"})");
  write_file(dir.path() / "b.json", R"({"schema": "zeroplan.cluster/1", "extends": "a.json"})");
  expect_error_containing([&] { read_document<ClusterProfile>(dir.path() / "a.json"); },
                          "cluster: \"extends\" nested deeper than 8 (a cycle?)");
  write_file(dir.path() / "c.json", R"({"schema": "zeroplan.cluster/1", "extends": "a100-sxm-80gb", "nodez": 2})");
  expect_error([&] { read_document<ClusterProfile>(dir.path() / "c.json"); },
               (dir.path() / "c.json").string() + ": cluster: unknown key \"nodez\" (did you mean \"nodes\"?)");
  write_file(dir.path() / "d.json", R"({"extends": "a100-sxm-80gb", "nodes": 2})");
  expect_error([&] { read_document<ClusterProfile>(dir.path() / "d.json"); },
               (dir.path() / "d.json").string() + ": cluster: missing \"schema\" (expected \"zeroplan.cluster/1\")");
  write_file(dir.path() / "e.json", R"({"schema": "zeroplan.cluster/1", "extends": "tpu-v4"})");
  expect_error_containing([&] { read_document<ClusterProfile>(dir.path() / "e.json"); },
                          "e.json: cluster: unknown cluster \"tpu-v4\"");
}

TEST(Cluster, DataDirFromEnvironment) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "clusters");
  write_file(dir.path() / "clusters" / "tiny.json", testing::read_file(shipped_clusters_dir() / "v100-sxm2-32gb.json"));
  ::setenv("ZEROPLAN_DATA_DIR", dir.path().c_str(), 1);
  const std::vector<ShippedCluster> list = list_shipped_clusters();
  const ClusterProfile c = resolve_cluster("tiny:2");
  ::unsetenv("ZEROPLAN_DATA_DIR");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].name, "tiny");
  EXPECT_EQ(c.name, "v100-sxm2-32gb:2");
}

TEST(Cluster, StrictKeys) {
  nlohmann::json j = a100();
  j["device"]["mem_byte"] = 1;
  expect_error([&] { j.get<ClusterProfile>(); },
               "cluster.device: unknown key \"mem_byte\" (did you mean \"mem_bytes\"?)");
  nlohmann::json k = a100();
  k["links"].erase("pcie");
  expect_error([&] { k.get<ClusterProfile>(); }, "cluster.links: missing required key \"pcie\"");
  nlohmann::json s = a100();
  s["schema"] = "zeroplan.plan/1";
  expect_error([&] { s.get<ClusterProfile>(); },
               "cluster: schema is string \"zeroplan.plan/1\", expected \"zeroplan.cluster/1\"");
}

class ClusterRule : public ::testing::TestWithParam<testing::Rule<ClusterProfile>> {};

TEST_P(ClusterRule, MessageIsExact) {
  ClusterProfile c = a100();
  GetParam().mutate(c);
  expect_error([&] { validate(c); }, GetParam().message);
  const nlohmann::json j = c;
  expect_error([&] { j.get<ClusterProfile>(); }, GetParam().message);
}

CollectiveFit fit() {
  return CollectiveFit{"all_gather", "gloo", "ring", "inter_node", {2}, 1e-4, 1e-9, 0.1, 0, 1 << 20, "", {}};
}

const testing::Rule<ClusterProfile> kClusterRules[] = {
    {"Name", [](ClusterProfile& c) { c.name.clear(); }, "cluster: name is empty"},
    {"Nodes", [](ClusterProfile& c) { c.nodes = 0; }, "cluster: nodes must be >= 1 (got 0)"},
    {"DevicesPerNode", [](ClusterProfile& c) { c.devices_per_node = 0; }, "cluster: devices_per_node must be >= 1 (got 0)"},
    // Ranks are counted in an int: 1e9 nodes once reported "8 devices (= -589934592)".
    {"NodesBounded", [](ClusterProfile& c) { c.nodes = 1'000'000'000; }, "cluster: nodes must be at most 999999 (got 1000000000)"},
    {"DevicesBounded", [](ClusterProfile& c) { c.nodes = 999'999; c.devices_per_node = 64; },
     "cluster: nodes 999999 x devices_per_node 64 = 63999936 devices, more than 2^24 (16,777,216)"},
    {"DeviceName", [](ClusterProfile& c) { c.device.name.clear(); }, "cluster: device.name is empty"},
    {"DeviceKind", [](ClusterProfile& c) { c.device.kind = "rocm"; },
     "cluster: device.kind must be one of \"cuda\", \"cpu\" (got \"rocm\")"},
    {"DeviceMem", [](ClusterProfile& c) { c.device.mem_bytes = 0; }, "cluster: device.mem_bytes must be > 0 (got 0)"},
    {"PeakFp32Required", [](ClusterProfile& c) { c.device.peak_flops.erase("fp32"); },
     "cluster: device.peak_flops has no \"fp32\" entry"},
    {"PeakDtype", [](ClusterProfile& c) { c.device.peak_flops["fp8"] = 1e15; },
     "cluster: device.peak_flops key must be one of \"fp32\", \"tf32\", \"fp16\", \"bf16\" (got \"fp8\")"},
    {"PeakPositive", [](ClusterProfile& c) { c.device.peak_flops["tf32"] = 0; },
     "cluster: device.peak_flops.tf32 must be > 0 (got 0.0)"},
    {"MemBw", [](ClusterProfile& c) { c.device.mem_bw_bytes_per_s = -1; },
     "cluster: device.mem_bw_bytes_per_s must be > 0 (got -1.0)"},
    {"Launch", [](ClusterProfile& c) { c.device.launch_overhead_s = -1e-6; },
     "cluster: device.launch_overhead_s must be >= 0 (got -1e-06)"},
    {"Efficiency", [](ClusterProfile& c) { c.device.compute_efficiency = 1.2; },
     "cluster: device.compute_efficiency must be in (0, 1] (got 1.2)"},
    {"AchievedBw", [](ClusterProfile& c) { c.device.mem_bw_achieved_bytes_per_s = 3e12; },
     "cluster: device.mem_bw_achieved_bytes_per_s must be in [0, mem_bw_bytes_per_s 2039000000000.0] (got 3000000000000.0)"},
    {"GemmTileAllOrNone", [](ClusterProfile& c) { c.device.gemm.tile_n = 0; },
     "cluster: device.gemm: sm_count, tile_m and tile_n must all be > 0 or all 0 (got 108, 256, 0)"},
    {"GemmFirstRowMatchesAll", [](ClusterProfile& c) { c.device.gemm.efficiency["bf16"][0].k_min = 8; },
     "cluster: device.gemm.efficiency.bf16 must start with a row whose m_min, n_min and k_min are 0"},
    {"GemmEfficiencyRange", [](ClusterProfile& c) { c.device.gemm.efficiency["bf16"][1].efficiency = 1.5; },
     "cluster: device.gemm.efficiency.bf16[1].efficiency must be in (0, 1] (got 1.5)"},
    {"GemmDtype", [](ClusterProfile& c) { c.device.gemm.efficiency["int8"] = {{0, 0, 0, 0.5}}; },
     "cluster: device.gemm.efficiency key must be one of \"fp32\", \"tf32\", \"fp16\", \"bf16\" (got \"int8\")"},
    {"FlashEfficiency", [](ClusterProfile& c) { c.device.attention.fused_bwd_efficiency = 1.5; },
     "cluster: device.attention.fused_bwd_efficiency must be in [0, 1] (got 1.5)"},
    {"HostMem", [](ClusterProfile& c) { c.host.mem_bytes = 0; }, "cluster: host.mem_bytes must be > 0 (got 0)"},
    {"HostCores", [](ClusterProfile& c) { c.host.cores = 0; }, "cluster: host.cores must be >= 1 (got 0)"},
    {"H2dPinned", [](ClusterProfile& c) { c.host.bw_h2d_pinned_bytes_per_s = 0; },
     "cluster: host.bw_h2d_pinned_bytes_per_s must be > 0 (got 0.0)"},
    {"H2dPageable", [](ClusterProfile& c) { c.host.bw_h2d_pageable_bytes_per_s = 0; },
     "cluster: host.bw_h2d_pageable_bytes_per_s must be > 0 (got 0.0)"},
    {"D2hPinned", [](ClusterProfile& c) { c.host.bw_d2h_pinned_bytes_per_s = 0; },
     "cluster: host.bw_d2h_pinned_bytes_per_s must be > 0 (got 0.0)"},
    {"D2hPageable", [](ClusterProfile& c) { c.host.bw_d2h_pageable_bytes_per_s = 0; },
     "cluster: host.bw_d2h_pageable_bytes_per_s must be > 0 (got 0.0)"},
    {"Memcpy", [](ClusterProfile& c) { c.host.memcpy_bw_bytes_per_s = 0; },
     "cluster: host.memcpy_bw_bytes_per_s must be > 0 (got 0.0)"},
    {"AdamRate", [](ClusterProfile& c) { c.host.optimizer.adam.flat_params_per_s = 0; },
     "cluster: host.optimizer.adam.flat_params_per_s must be > 0 (got 0.0)"},
    {"SgdRate", [](ClusterProfile& c) { c.host.optimizer.sgd.per_tensor_params_per_s = 0; },
     "cluster: host.optimizer.sgd.per_tensor_params_per_s must be > 0 (got 0.0)"},
    {"LinkName", [](ClusterProfile& c) { c.links.inter_node.name.clear(); }, "cluster: links.inter_node.name is empty"},
    {"LinkBw", [](ClusterProfile& c) { c.links.pcie.bw_bytes_per_s = 0; },
     "cluster: links.pcie.bw_bytes_per_s must be > 0 (got 0.0)"},
    {"LinkLatency", [](ClusterProfile& c) { c.links.intra_node.latency_s = -1; },
     "cluster: links.intra_node.latency_s must be >= 0 (got -1.0)"},
    {"CollectiveOp",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].op = "all_to_all";
       c.provenance["collectives"] = {"probe", "measured"};
     },
     "cluster: collectives[0].op must be one of \"all_reduce\", \"all_gather\", \"reduce_scatter\", \"broadcast\", "
     "\"reduce\" (got \"all_to_all\")"},
    {"CollectiveBackend",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].backend = "mpi";
     },
     "cluster: collectives[0].backend must be one of \"nccl\", \"gloo\", \"shm\" (got \"mpi\")"},
    {"CollectiveAlgorithm",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].algorithm = "nvls";
     },
     "cluster: collectives[0].algorithm must be one of \"ring\", \"tree\" (got \"nvls\")"},
    {"CollectiveScope",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].scope = "rack";
     },
     "cluster: collectives[0].scope must be one of \"intra_node\", \"inter_node\" (got \"rack\")"},
    {"CollectiveDtype",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].dtype = "int8";
     },
     "cluster: collectives[0].dtype must be one of \"fp32\", \"bf16\", \"fp16\" (got \"int8\")"},
    {"CollectivePointsIncreasing",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].points = {{4096, 1e-4}, {4096, 2e-4}};
     },
     "cluster: collectives[0].points[1] bytes 4096.0 not above the previous point's 4096.0"},
    {"CollectivePointsSeconds",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].points = {{4096, 0}};
     },
     "cluster: collectives[0].points[0] seconds must be in (0, 1e6] (got 0.0)"},
    {"CollectiveWorldSizesEmpty",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].world_sizes.clear();
     },
     "cluster: collectives[0].world_sizes is empty"},
    {"CollectiveWorldSize",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].world_sizes = {1};
     },
     "cluster: collectives[0].world_sizes has 1 (must be >= 2)"},
    {"CollectiveAlpha",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].alpha_s = -1;
     },
     "cluster: collectives[0].alpha_s must be >= 0 (got -1.0)"},
    {"CollectiveBeta",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].beta_s_per_byte = -1;
     },
     "cluster: collectives[0].beta_s_per_byte must be >= 0 (got -1.0)"},
    {"CollectiveResidual",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].fit_residual = -1;
     },
     "cluster: collectives[0].fit_residual must be >= 0 (got -1.0)"},
    {"CollectiveMinBytes",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].min_bytes = -1;
     },
     "cluster: collectives[0].min_bytes must be >= 0 (got -1)"},
    {"CollectiveRange",
     [](ClusterProfile& c) {
       c.collectives = {fit()};
       c.collectives[0].min_bytes = 1 << 21;
     },
     "cluster: collectives[0].min_bytes 2097152 > max_bytes 1048576"},
    {"AllocatorFactor", [](ClusterProfile& c) { c.allocator_overhead_factor = 0.9; },
     "cluster: allocator_overhead_factor must be in [1, 10] (got 0.9)"},
    {"AllocatorFactorHuge", [](ClusterProfile& c) { c.allocator_overhead_factor = 1e13; },
     "cluster: allocator_overhead_factor must be in [1, 10] (got 10000000000000.0)"},
    {"ProvenanceSource", [](ClusterProfile& c) { c.provenance["device.mem_bytes"].source = "vendor"; },
     "cluster: provenance.device.mem_bytes.source must be one of \"datasheet\", \"paper\", \"microbenchmark\", \"probe\", "
     "\"estimate\", "
     "\"calibration\" (got \"vendor\")"},
    {"CalibrationCompute", [](ClusterProfile& c) { c.calibration.compute_time_scale = 0; },
     "cluster: calibration.compute_time_scale must be > 0 (got 0.0)"},
    {"CalibrationComm", [](ClusterProfile& c) { c.calibration.comm_time_scale = -2; },
     "cluster: calibration.comm_time_scale must be > 0 (got -2.0)"},
    {"CalibrationNeedsProvenance", [](ClusterProfile& c) { c.calibration.comm_time_scale = 1.5; },
     "cluster: no provenance for calibration.comm_time_scale"},  // only the factors not at 1 are written
    {"ProvenanceCitation", [](ClusterProfile& c) { c.provenance["device.mem_bytes"].citation.clear(); },
     "cluster: provenance.device.mem_bytes.citation is empty"},
    {"ProvenanceDangling", [](ClusterProfile& c) { c.provenance["device.mem_byte"] = {"estimate", "typo"}; },
     "cluster: provenance names \"device.mem_byte\", which is not a field (did you mean \"device.mem_bytes\"?)"},
    {"ProvenanceMissing", [](ClusterProfile& c) { c.provenance.erase("host.memcpy_bw_bytes_per_s"); },
     "cluster: no provenance for host.memcpy_bw_bytes_per_s"},
    {"ProvenanceMissingCollective", [](ClusterProfile& c) { c.collectives = {fit()}; },
     "cluster: no provenance for collectives[0].world_sizes[0]"},
    {"ProvenanceMissingPeak", [](ClusterProfile& c) { c.provenance.erase("device.peak_flops.tf32"); },
     "cluster: no provenance for device.peak_flops.tf32"},
};

INSTANTIATE_TEST_SUITE_P(Rules, ClusterRule, ::testing::ValuesIn(kClusterRules),
                         [](const ::testing::TestParamInfo<testing::Rule<ClusterProfile>>& info) { return std::string(info.param.name); });

TEST(Cluster, GpuTimeModelIsOptional) {
  // Without the per-op GPU model (every cluster file written before it) nothing of it is written.
  ClusterProfile c = a100();
  c.device.gemm = {};
  c.device.attention = {};
  c.device.mem_bw_achieved_bytes_per_s = 0;
  for (const char* path : {"device.gemm.sm_count", "device.gemm.tile_m", "device.gemm.tile_n", "device.gemm.efficiency",
                           "device.attention", "device.mem_bw_achieved_bytes_per_s"})
    c.provenance.erase(path);
  validate(c);
  const nlohmann::json j = c;
  EXPECT_FALSE(j["device"].contains("gemm"));
  EXPECT_FALSE(j["device"].contains("attention"));
  EXPECT_FALSE(j["device"].contains("mem_bw_achieved_bytes_per_s"));
  EXPECT_EQ(j.get<ClusterProfile>(), c);
}

TEST(Cluster, ShippedGpuNumbersComeFromMicrobenchmarksOrSayEstimate) {
  // Every shipped GPU cluster has the per-op model, and no number of it is fitted to training runs:
  // its provenance is a datasheet, a paper, a published microbenchmark, or "estimate". Only the
  // calibration terms beside them are fitted, to the public table they name (test sim.calibration).
  for (const char* name : {"a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb"}) {
    const ClusterProfile c = resolve_cluster(name);
    EXPECT_GT(c.device.gemm.sm_count, 0) << name;
    EXPECT_FALSE(c.device.gemm.efficiency.empty()) << name;
    EXPECT_GT(c.device.mem_bw_achieved_bytes_per_s, 0) << name;
    EXPECT_GT(c.device.attention.fused_fwd_efficiency, 0) << name;
    for (const auto& [path, p] : c.provenance) {
      if (path.rfind("calibration.", 0) == 0) {
        EXPECT_EQ(p.source, "calibration") << name << " " << path;
        EXPECT_NE(p.citation.find("llm-foundry"), std::string::npos) << name << " " << path;
        EXPECT_NE(p.citation.find("commit 8c8dd48f7216"), std::string::npos) << name << " " << path;
        continue;
      }
      EXPECT_NE(p.source, "calibration") << name << " " << path;
      EXPECT_NE(p.source, "probe") << name << " " << path;
      if (p.source == "estimate") {
        EXPECT_NE(p.citation.find("not measured"), std::string::npos) << name << " " << path;
      }
    }
  }
}

TEST(Cluster, ProvenanceCoversSubtrees) {
  ClusterProfile c = a100();
  c.provenance.erase("host.optimizer");
  expect_error([&] { validate(c); }, "cluster: no provenance for host.optimizer.adam.per_tensor_params_per_s");
  c.provenance["host"] = Provenance{"probe", "measured by zeroplan probe on 2025-01-31"};
  validate(c);
}

}  // namespace
}  // namespace zeroplan
