// One plan per rule between knobs (profiles' plan_rules()), each breaking it and no rule before it: the
// schema test, the tuner test and the executor test feed them to validate, to the tuner and to what `run`
// checks before any rank starts, and expect the rule's one message from each.
#pragma once

#include <functional>
#include <vector>

#include "zeroplan/profiles/plan.h"

namespace zeroplan::testing {

// A valid plan of 4 ranks, global batch 16: every case edits it.
inline Plan rule_case_base() {
  Plan p;
  p.world_size = 4;
  p.global_batch = 16;
  p.micro_batch = 4;
  p.microbatches = 1;
  return p;
}

inline std::vector<std::function<void(Plan&)>> plan_rule_cases() {
  return {
      [](Plan& p) { p.pipeline_stages = 3; },                                   // world_size % stages
      [](Plan& p) { p.global_batch = 20; },                                     // the batch split
      [](Plan& p) { p.reshard_after_forward = true; p.zero_stage = 2; },
      [](Plan& p) { p.pipeline.checkpoint = "always"; },                        // without pipeline stages
      [](Plan& p) { p.pipeline_stages = 2; p.global_batch = 8; p.pipeline.checkpoint = "always"; p.pipeline.schedule = "1f1b"; },
      [](Plan& p) {
        p.pipeline_stages = 2; p.global_batch = 8; p.pipeline.checkpoint = "always";
        p.checkpointing.mode = Checkpointing::Mode::all;
      },
      [](Plan& p) {
        p.pipeline_stages = 2; p.global_batch = 8;
        p.pipeline.balance.mode = PipelineBalance::Mode::units; p.pipeline.balance.units = {1, 1, 1};
      },
      [](Plan& p) { p.pipeline_stages = 2; p.global_batch = 8; p.zero_stage = 3; },
      [](Plan& p) { p.offload.params = true; p.zero_stage = 2; },
      [](Plan& p) { p.offload.optimizer = true; },
      [](Plan& p) { p.zero_stage = 1; p.offload.grads = true; },
      [](Plan& p) { p.offload_model.enabled = true; p.offload_model.microbatches = 3; },
      [](Plan& p) { p.offload_model.enabled = true; p.zero_stage = 1; },
      [](Plan& p) { p.offload_model.enabled = true; p.pipeline_stages = 2; p.global_batch = 8; },
      [](Plan& p) { p.checkpoint_offload = true; },
      [](Plan& p) { p.checkpoint_offload = true; p.checkpointing.mode = Checkpointing::Mode::all; p.offload_model.enabled = true; },
      [](Plan& p) { p.offload_model.enabled = true; p.checkpointing.mode = Checkpointing::Mode::all; },
      [](Plan& p) { p.offload_model.enabled = true; p.offload.activations_ratio = 0.5; },
      [](Plan& p) { p.offload_model.enabled = true; p.localsgd_frequency = 4; },
      [](Plan& p) { p.localsgd_frequency = 4; p.zero_stage = 1; },
      [](Plan& p) { p.localsgd_frequency = 4; p.pipeline_stages = 2; p.global_batch = 8; },
      [](Plan& p) { p.localsgd_warmup_steps = 10; },
      [](Plan& p) { p.slowmo_frequency = 8; },
      [](Plan& p) { p.localsgd_frequency = 4; p.slowmo_momentum = 0.5; },
      [](Plan& p) { p.localsgd_frequency = 4; p.optimizer.max_grad_norm = 1.0; },
      [](Plan& p) { p.optimizer.momentum = 0.9; },
      [](Plan& p) { p.adascale = true; },
      [](Plan& p) { p.precision.loss_scale.mode = LossScale::Mode::dynamic; },
      [](Plan& p) { p.precision.broadcast_fp16 = true; },
      [](Plan& p) { p.precision.fp32_reduce_scatter = true; p.zero_stage = 1; },
      [](Plan& p) { p.precision.fp32_reduce_scatter = true; p.zero_stage = 2; p.precision.reduce_dtype = "bf16"; },
  };
}

// One valid plan per run rule (knobs.h run_rules(): what the executor does not run), each breaking it and
// no run rule before it.
inline std::vector<std::function<void(Plan&)>> run_rule_cases() {
  auto bf16 = [](Plan& p) { p.precision.param_dtype = p.precision.compute_dtype = "bf16"; };
  return {
      [](Plan& p) { p.precision.param_dtype = "bf16"; },  // computes in fp32 from bf16 parameters
      [=](Plan& p) { bf16(p); p.localsgd_frequency = 4; },
      [](Plan& p) {
        p.precision.compute_dtype = "fp16"; p.precision.loss_scale.mode = LossScale::Mode::dynamic;
        p.adascale = true; p.optimizer.name = "sgd";
      },
      [](Plan& p) { p.adascale = true; p.optimizer.name = "sgd"; p.localsgd_frequency = 4; },
      [](Plan& p) { p.adascale = true; p.optimizer.name = "sgd"; p.pipeline_stages = 2; p.global_batch = 8; },
  };
}

}  // namespace zeroplan::testing
