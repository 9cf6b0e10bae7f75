// zeroplan probe: measure this machine -> ClusterProfile (exec/probe.h).
//
//   zeroplan probe -o profiles/data/clusters/local.json [--world-sizes 2,4] [--quick]
//   zeroplan probe -o local.json --reuse-if-fresh 3600     keep a probe younger than an hour
//   zeroplan probe --device cuda -o here.json [--base h100-sxm-80gb]   one GPU over its part's shipped file
//
// The collectives are timed by ranks this command starts itself: `zeroplan probe --collectives-worker`
// (hidden), which joins the launcher's store, measures and writes its result for the parent.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>

#include "cli.h"
#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/probe.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::cli {
namespace {

struct ProbeArgs {
  std::string output;
  std::string name = "local";
  std::vector<int> world_sizes{2};
  bool quick = false;
  bool no_collectives = false;
  bool world_sizes_given = false;
  std::string device = "cpu";
  std::string base;
  double reuse_if_fresh_s = -1;
  std::int64_t device_memory = 0;
  double timeout_s = 90;
  bool collectives_worker = false;
};

std::string gbps(double bytes_per_s) { return fmt::format("{:.2f} GB/s", bytes_per_s / 1e9); }

void print_summary(const ClusterProfile& c) {
  const DeviceSpec& d = c.device;
  fmt::print(stderr, "cluster {}: {}\n", c.name, c.description);
  fmt::print(stderr,
             "  device {} x {}: {:.2f} GiB, fp32 peak {:.1f} GFLOP/s x efficiency {:.2f}, memory {}, "
             "launch {:.2f} us\n",
             c.devices_per_node, d.name, d.mem_bytes / double(1ull << 30), d.peak_flops.at("fp32") / 1e9,
             d.compute_efficiency, gbps(d.mem_bw_bytes_per_s), d.launch_overhead_s * 1e6);
  const HostSpec& h = c.host;
  fmt::print(stderr, "  host {} cores, {:.2f} GiB; D2H {}, H2D {}, memcpy {}\n", h.cores,
             h.mem_bytes / double(1ull << 30), gbps(h.bw_d2h_pinned_bytes_per_s), gbps(h.bw_h2d_pinned_bytes_per_s),
             gbps(h.memcpy_bw_bytes_per_s));
  fmt::print(stderr, "  optimizer params/s: adam {:.3g} per-tensor, {:.3g} flat; sgd {:.3g} per-tensor, {:.3g} flat\n",
             h.optimizer.adam.per_tensor_params_per_s, h.optimizer.adam.flat_params_per_s,
             h.optimizer.sgd.per_tensor_params_per_s, h.optimizer.sgd.flat_params_per_s);
  for (const CollectiveFit& f : c.collectives) {
    fmt::print(stderr, "  {:<19} {} ranks {}: alpha {:8.1f} us, beta {:.3g} s/B ({}), residual {:.3f}\n",
               f.dtype.empty() ? f.op : f.op + " " + f.dtype, f.world_sizes.front(), f.backend, f.alpha_s * 1e6, f.beta_s_per_byte,
               f.beta_s_per_byte > 0 ? gbps(1 / f.beta_s_per_byte) : "-", f.fit_residual);
  }
}

// The shipped file of a GPU's part, from the driver's name of it.
std::string shipped_cluster_for(const std::string& gpu) {
  auto has = [&](const char* part) { return gpu.find(part) != std::string::npos; };
  if (has("H200")) return "h200-sxm-141gb";
  if (has("H100")) return "h100-sxm-80gb";
  if (has("A100")) return has("80GB") ? "a100-sxm-80gb" : "a100-sxm-40gb";
  if (has("V100")) return "v100-sxm2-32gb";
  throw ExitError(kBadInput, fmt::format("probe --device: no shipped cluster file for \"{}\"; give --base with a "
                                         "cluster of the same part (a shipped name or a file)",
                                         gpu));
}

// probe --device cuda: the GPU over its part's file, the base's GEMM buckets fitted to the sweep.
int run_probe_gpu(const ProbeArgs& a, const Globals& g) {
  const std::string base_name = a.base.empty() ? shipped_cluster_for(exec::device_display_name(a.device)) : a.base;
  const ClusterProfile base = resolve_cluster(base_name);
  exec::ProbeOptions o;
  o.name = a.name == "local" ? base.name + "-here" : a.name;
  o.quick = a.quick;
  if (!g.quiet) o.progress = [](const std::string& line) { fmt::print(stderr, "probe: {}\n", line); };
  exec::GpuProbe r = exec::probe_gpu(o, base, a.device);
  ClusterProfile& c = r.cluster;
  std::string measured;
  for (const auto& [dtype, rates] : r.gemms) {
    std::vector<sim::GemmPoint> points;
    std::string listed;
    for (const exec::GemmRate& x : rates) {
      points.push_back({double(x.m), double(x.n), double(x.k), x.flops_per_s});
      listed += fmt::format("{}{} {:.1f} TFLOP/s", listed.empty() ? "" : ", ", x.m, x.flops_per_s / 1e12);
    }
    auto it = base.device.gemm.efficiency.find(dtype);
    std::vector<GemmBucket> buckets =
        it != base.device.gemm.efficiency.end() ? it->second : std::vector<GemmBucket>{{0, 0, 0, 1}};
    c.device.gemm.efficiency[dtype] = sim::fit_gemm_buckets(c, dtype, std::move(buckets), points);
    if (!g.quiet) {
      const double peak = c.device.peak_flops.count(dtype) ? c.device.peak_flops.at(dtype) : 0;
      for (const exec::GemmRate& x : rates)
        fmt::print(stderr, "  GEMM {} {:>5}^3 {:8.1f} TFLOP/s{}\n", dtype, x.m, x.flops_per_s / 1e12,
                   peak > 0 ? fmt::format("  {:5.1f}% of the datasheet's {:.0f}", 100 * x.flops_per_s / peak, peak / 1e12) : "");
    }
    measured += fmt::format("{}{}: {}", measured.empty() ? "" : "; ", dtype, listed);
  }
  if (!measured.empty())
    c.provenance["device.gemm.efficiency"] = Provenance{
        "probe", fmt::format("the buckets of {} fitted (sim::fit_gemm_buckets) to m = n = k GEMMs measured by zeroplan "
                             "probe --device on {}: {}",
                             base.name, r.date, measured)};
  validate(c);
  const std::string output = a.output.empty() ? local_probe_path().string() : a.output;
  write_document(output, c);
  if (!g.quiet) fmt::print(stderr, "wrote {}\n", output);
  if (g.json) fmt::print("{}", to_json_string(c));
  return kOk;
}

int run_probe(const ProbeArgs& a, const Globals& g) {
  if (a.collectives_worker) return exec::run_collectives_worker();
  if (a.device != "cpu") return run_probe_gpu(a, g);
  if (!a.base.empty()) throw ExitError(kBadInput, "probe --base applies to --device cuda (a GPU over its part's file)");
  if (a.reuse_if_fresh_s >= 0) {
    if (a.output.empty()) throw ExitError(kBadInput, "--reuse-if-fresh needs -o FILE (the probe to reuse)");
    const auto max_age = std::chrono::seconds(static_cast<std::int64_t>(a.reuse_if_fresh_s));
    if (auto fresh = exec::fresh_probe(a.output, max_age, a.no_collectives ? std::vector<int>{} : a.world_sizes)) {
      if (!g.quiet) fmt::print(stderr, "probe: reusing {} (younger than {} s)\n", a.output, max_age.count());
      if (g.json) fmt::print("{}", to_json_string(*fresh));
      return kOk;
    }
  }
  exec::ProbeOptions o;
  o.name = a.name;
  // Without collectives and without --world-sizes: one rank per node, which has every core (one GPU).
  o.world_sizes = a.no_collectives && !a.world_sizes_given ? std::vector<int>{} : a.world_sizes;
  o.quick = a.quick;
  o.collectives = !a.no_collectives;
  o.device_memory_bytes = a.device_memory;
  o.worker_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(a.timeout_s * 1000));
  o.worker_argv = {"zeroplan", "probe", "--collectives-worker"};
  if (!g.quiet) o.progress = [](const std::string& line) { fmt::print(stderr, "probe: {}\n", line); };
  const ClusterProfile c = exec::probe_cluster(o);
  if (!g.quiet) print_summary(c);
  // Without -o the probe goes where `--cluster local` and autopilot look for it.
  const std::string output = a.output.empty() ? local_probe_path().string() : a.output;
  {
    const auto dir = std::filesystem::path(output).parent_path();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    write_document(output, c);
    if (!g.quiet) fmt::print(stderr, "wrote {}{}\n", output, a.output.empty() ? " (use it with --cluster local)" : "");
  }
  if (g.json) fmt::print("{}", to_json_string(c));
  return kOk;
}

}  // namespace

Action add_probe(CLI::App& app, const Globals& globals) {
  auto a = std::make_shared<ProbeArgs>();
  app.add_option("-o,--output", a->output, "Write the ClusterProfile here (default: this machine's probe cache, which --cluster local reads)")->check(output_path());
  app.add_option("--name", a->name, "The profile's name")->capture_default_str();
  CLI::Option* world_sizes =
      app.add_option("--world-sizes", a->world_sizes,
                     "Ranks to fit the collectives at, e.g. 2,4 (each >= 2); the largest is the ranks per node")
      ->delimiter(',')
      ->check(number_in(2, 64))
      ->capture_default_str();
  app.add_flag("--quick", a->quick, "Small sizes and few repeats: seconds, for tests and CI");
  app.add_flag("--no-collectives", a->no_collectives,
               "Skip the collectives (links then estimated from memcpy); without --world-sizes, one rank per node "
               "with every core");
  app.add_option("--reuse-if-fresh", a->reuse_if_fresh_s,
                 "Keep -o FILE if it is younger than SECONDS, valid, and has fits for --world-sizes")
      ->check(non_negative());
  app.add_option("--device-memory", a->device_memory,
                 "Bytes of memory per device (rank) to record (default: the node's memory / ranks per node)")
      ->check(positive());
  app.add_option("--timeout", a->timeout_s, "Seconds before a silent collectives worker ends the probe")
      ->capture_default_str()
      ->check(positive());
  app.add_option("--device", a->device,
                 "cpu (this machine's cores as the devices) or cuda / cuda:<i>: one GPU and its host over --base")
      ->capture_default_str();
  app.add_option("--base", a->base,
                 "With --device cuda: the cluster of the same part whose datasheet numbers stay (default: the "
                 "shipped file named by the GPU, e.g. h100-sxm-80gb)");
  app.add_flag("--collectives-worker", a->collectives_worker)->group("");  // hidden: one rank of the probe
  return [a, world_sizes, &globals] {
    a->world_sizes_given = world_sizes->count() > 0;
    return run_probe(*a, globals);  // errors: main.cpp's one map
  };
}

}  // namespace zeroplan::cli
