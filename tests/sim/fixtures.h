// Clusters, models and plans built in code for the simulator tests and benchmark.
#pragma once

#include <cstdint>
#include <string>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"

namespace zeroplan::sim::testing {

// `nodes` x 8 A100-SXM4-80GB, NVLink inside, 8 x 200 Gb/s InfiniBand per node, no fitted collectives.
inline ClusterProfile a100(int nodes) {
  ClusterProfile c;
  c.name = "a100-test";
  c.nodes = nodes;
  c.devices_per_node = 8;
  c.device.name = "NVIDIA A100-SXM4-80GB";
  c.device.kind = "cuda";
  c.device.mem_bytes = 80'000'000'000LL;
  c.device.peak_flops = {{"fp32", 19.5e12}, {"tf32", 156e12}, {"fp16", 312e12}, {"bf16", 312e12}};
  c.device.mem_bw_bytes_per_s = 2.0e12;
  c.device.launch_overhead_s = 5e-6;
  c.device.compute_efficiency = 0.5;
  c.host.mem_bytes = 2'000'000'000'000LL;
  c.host.cores = 128;
  c.host.bw_h2d_pinned_bytes_per_s = 25e9;
  c.host.bw_h2d_pageable_bytes_per_s = 10e9;
  c.host.bw_d2h_pinned_bytes_per_s = 24e9;
  c.host.bw_d2h_pageable_bytes_per_s = 9e9;
  c.host.memcpy_bw_bytes_per_s = 50e9;
  c.host.optimizer.adam = {1e9, 2e9};
  c.host.optimizer.sgd = {2e9, 4e9};
  c.links.intra_node = {"NVLink3", 300e9, 5e-6};
  c.links.inter_node = {"InfiniBand HDR 8x200G", 200e9, 10e-6};
  c.links.pcie = {"PCIe Gen4 x16", 25e9, 1e-6};
  c.allocator_overhead_factor = 1.05;
  return c;
}

// This kind of machine: one node, `ranks` CPU "devices" sharing the cores, Gloo.
inline ClusterProfile cpu(int ranks = 2) {
  ClusterProfile c;
  c.name = "cpu-test";
  c.nodes = 1;
  c.devices_per_node = ranks;
  c.device.name = "cpu";
  c.device.kind = "cpu";
  c.device.mem_bytes = 8'000'000'000LL;
  c.device.peak_flops = {{"fp32", 50e9}, {"bf16", 25e9}, {"fp16", 10e9}};
  c.device.mem_bw_bytes_per_s = 10e9;
  c.device.launch_overhead_s = 10e-6;
  c.device.compute_efficiency = 0.5;
  c.host.mem_bytes = 8'000'000'000LL;
  c.host.cores = 2;
  c.host.bw_h2d_pinned_bytes_per_s = c.host.bw_d2h_pinned_bytes_per_s = 5e9;
  c.host.bw_h2d_pageable_bytes_per_s = c.host.bw_d2h_pageable_bytes_per_s = 4e9;
  c.host.memcpy_bw_bytes_per_s = 5e9;
  c.host.optimizer.adam = {1e8, 2e8};
  c.host.optimizer.sgd = {2e8, 4e8};
  c.links.intra_node = {"loopback", 2e9, 20e-6};
  c.links.inter_node = {"ethernet", 1e9, 50e-6};
  c.links.pcie = {"none", 5e9, 0};
  c.shares_cores = true;
  return c;
}

// An analytic GPT profile (Korthikanti et al. activations at 16-bit, 24bsh^2 + 4bs^2h FLOPs per block),
// figures per sample of micro batch: embed, `layers` x block, head (tied weights: LayerNorm only).
inline ModelProfile gpt(int layers, std::int64_t hidden, int heads, std::int64_t seq, std::int64_t vocab = 50257) {
  ModelProfile m;
  m.name = "gpt-analytic";
  m.source = "analytic:gpt";
  m.measured = false;
  m.device = "analytic";
  m.dtype = "fp16";
  m.batch = 1;
  m.seq_len = seq;
  m.input_shape = {1, seq};
  const double h = static_cast<double>(hidden), s = static_cast<double>(seq);
  auto per_sample = [](double v) { return Figure::proportional(v, 1); };
  UnitProfile embed;
  embed.name = "embed";
  embed.type = "Embedding";
  embed.params = vocab * hidden + seq * hidden;
  embed.bytes_param = embed.params * 2;
  embed.bytes_output = per_sample(2 * s * h);
  embed.bytes_saved = per_sample(s * 8);
  embed.bytes_peak_fwd = per_sample(2 * s * h);
  embed.bytes_peak_bwd = per_sample(2 * s * h);
  embed.flops_fwd = per_sample(2 * s * h);
  embed.flops_bwd = per_sample(4 * s * h);
  UnitProfile block;
  block.name = "block";
  block.type = "TransformerBlock";
  block.count = layers;
  block.params = 12 * hidden * hidden + 13 * hidden;
  block.bytes_param = block.params * 2;
  block.bytes_output = per_sample(2 * s * h);
  block.bytes_saved = per_sample(s * h * (34 + 5.0 * heads * s / h));
  block.bytes_peak_fwd = per_sample(8 * s * h);
  block.bytes_peak_bwd = per_sample(16 * s * h);
  block.flops_fwd = per_sample(24 * s * h * h + 4 * s * s * h);
  block.flops_bwd = per_sample(2 * (24 * s * h * h + 4 * s * s * h));
  UnitProfile head;
  head.name = "head";
  head.type = "Head";
  head.params = 2 * hidden;
  head.bytes_param = head.params * 2;
  head.bytes_output = per_sample(4 * s * static_cast<double>(vocab));
  head.bytes_saved = per_sample(2 * s * h + 4 * s * static_cast<double>(vocab));
  head.bytes_peak_fwd = per_sample(4 * s * static_cast<double>(vocab));
  head.bytes_peak_bwd = per_sample(4 * s * static_cast<double>(vocab));
  head.flops_fwd = per_sample(2 * s * h * static_cast<double>(vocab));
  head.flops_bwd = per_sample(4 * s * h * static_cast<double>(vocab));
  m.units = {embed, block, head};
  return m;
}

// A mixed-precision (fp16 params, fp32 master, Adam) plan at `stage` on `world` ranks.
inline Plan mixed_plan(int world, int stage, int micro_batch = 1, int microbatches = 1) {
  Plan p;
  p.world_size = world;
  p.micro_batch = micro_batch;
  p.microbatches = microbatches;
  p.global_batch = micro_batch * microbatches * world;
  p.zero_stage = stage;
  p.reshard_after_forward = stage == 3;
  p.precision.param_dtype = "fp16";
  p.precision.compute_dtype = "fp16";
  p.precision.reduce_dtype = "fp16";
  p.precision.master_fp32 = true;
  p.precision.loss_scale.mode = LossScale::Mode::dynamic;
  return p;
}

}  // namespace zeroplan::sim::testing
