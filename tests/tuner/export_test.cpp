// Every exporter against golden files (tests/tuner/update_golden.sh regenerates them) and against its
// format's rules.
#include "zeroplan/tuner/exports.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/tuner/evaluator.h"
#include "zeroplan/tuner/tune.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan::tuner {
namespace {

using testing::expect_golden;
using testing::small_gpt;

Plan base(int world, int micro, int mbs) {
  Plan p;
  p.world_size = world;
  p.micro_batch = micro;
  p.microbatches = mbs;
  p.global_batch = world * micro * mbs;
  return p;
}

// Named plans covering each tool's cases.
std::vector<std::pair<std::string, Plan>> cases() {
  std::vector<std::pair<std::string, Plan>> out;
  {  // FSDP FULL_SHARD with full offload and checkpointing of the blocks, bf16
    Plan p = base(16, 2, 4);
    p.zero_stage = 3;
    p.reshard_after_forward = true;
    p.offload = {true, true, true, 0};
    p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = "bf16";
    p.checkpointing.mode = Checkpointing::Mode::units;
    p.checkpointing.units = {1};
    p.flat_params = true;
    p.optimizer.max_grad_norm = 1.0;  // clip_grad_norm_ in the FSDP2 script, FSDP's own in fairscale's, DeepSpeed's gradient_clipping
    out.emplace_back("stage3_offload_bf16", p);
  }
  {  // ZeRO-2, fp16 with dynamic loss scale, fp32 reduce-scatter, no accumulation
    Plan p = base(8, 4, 1);
    p.zero_stage = 2;
    p.precision.param_dtype = p.precision.compute_dtype = "fp16";
    p.precision.reduce_dtype = "fp32";
    p.precision.fp32_reduce_scatter = true;
    p.precision.loss_scale.mode = LossScale::Mode::dynamic;
    p.optimizer.max_grad_norm = 0.5;  // unscaled first, then OSS's clip_grad_norm
    out.emplace_back("stage2_fp16", p);
  }
  {  // ZeRO-1 with optimizer offload, AdamW
    Plan p = base(8, 1, 2);
    p.zero_stage = 1;
    p.offload.optimizer = p.offload.grads = true;
    p.optimizer.name = "adamw";
    p.optimizer.weight_decay = 0.1;
    out.emplace_back("stage1_offload_adamw", p);
  }
  {  // DDP + LocalSGD / SlowMo
    Plan p = base(16, 2, 2);
    p.localsgd_frequency = 4;
    p.slowmo_frequency = 48;
    p.slowmo_momentum = 0.5;
    out.emplace_back("ddp_localsgd", p);
  }
  {  // stage 3 with partial activation offload: only zeroplan can run it
    Plan p = base(8, 2, 1);
    p.zero_stage = 3;
    p.offload.activations_ratio = 0.37;
    out.emplace_back("stage3_activation_offload", p);
  }
  {  // OffloadModel
    Plan p = base(1, 8, 1);
    p.offload_model = {true, 2, true, 4};
    out.emplace_back("offload_model", p);
  }
  {  // SlowMo with a slow learning rate, after a warm-up of synchronous steps
    Plan p = base(16, 2, 1);
    p.localsgd_frequency = 3;
    p.localsgd_warmup_steps = 100;
    p.slowmo_frequency = 6;
    p.slowmo_momentum = 0.2;
    p.slowmo_lr = 0.7;
    out.emplace_back("slowmo_lr_warmup", p);
  }
  {  // AdaScale over SGD with momentum, 8 ranks x 2 accumulated microbatches
    Plan p = base(8, 2, 2);
    p.optimizer.name = "sgd";
    p.optimizer.lr = 0.1;
    p.optimizer.momentum = 0.9;
    p.adascale = true;
    out.emplace_back("ddp_adascale", p);
  }
  {  // ZeRO-2 with every unit checkpointed, the kept inputs on the host
    Plan p = base(8, 2, 1);
    p.zero_stage = 2;
    p.checkpointing.mode = Checkpointing::Mode::all;
    p.checkpoint_offload = true;
    out.emplace_back("stage2_checkpoint_offload", p);
  }
  {  // fairscale Pipe: 2 GPipe stages x 8 data-parallel, checkpoint except_last, OSS
    Plan p = base(8, 1, 4);
    p.world_size = 16;
    p.pipeline_stages = 2;
    p.pipeline.checkpoint = "except_last";
    p.zero_stage = 1;
    out.emplace_back("pipeline_gpipe", p);
  }
  {  // DeepSpeed's PipelineEngine: 2 1F1B stages (the uniform split) x 8 data-parallel, fp16
    Plan p = base(8, 2, 4);
    p.world_size = 16;
    p.pipeline_stages = 2;
    p.pipeline.schedule = "1f1b";
    p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = "fp16";
    p.precision.loss_scale.mode = LossScale::Mode::dynamic;
    out.emplace_back("pipeline_1f1b", p);
  }
  return out;
}

std::string notes_text(const Export& e) {
  std::string s;
  for (const auto& u : e.unsupported) s += "unsupported: " + u + "\n";
  for (const auto& n : e.notes) s += "note: " + n + "\n";
  return s;
}

TEST(Export, GoldenFiles) {
  const ModelProfile m = small_gpt();
  for (const auto& [name, plan] : cases()) {
    ASSERT_NO_THROW(validate(plan, m)) << name;
    for (const Export& e : export_all(plan, m, std::max(1, plan.world_size / 8), 8, "cuda")) {
      SCOPED_TRACE(name + "/" + e.file);
      if (e.expressible()) {
        EXPECT_FALSE(e.text.empty());
        expect_golden(name + "/" + e.file, e.text);
      } else {
        EXPECT_TRUE(e.text.empty());
      }
      expect_golden(name + "/" + e.file + ".notes.txt", notes_text(e));
    }
  }
}

TEST(Export, PlanJsonReadsBackToTheSamePlan) {
  for (const auto& [name, plan] : cases()) EXPECT_EQ(parse_document<Plan>(export_plan(plan).text), plan) << name;
}

TEST(Export, DeepSpeedBatchIdentityAndStage3OnlyPartialOffload) {
  const ModelProfile m = small_gpt();
  for (const auto& [name, plan] : cases()) {
    const Export e = export_deepspeed(plan, m);
    if (!e.expressible()) continue;
    const auto j = nlohmann::json::parse(e.text);
    EXPECT_EQ(j.at("train_batch_size").get<int>(), j.at("train_micro_batch_size_per_gpu").get<int>() *
                                                       j.at("gradient_accumulation_steps").get<int>() * plan.data_parallel_size())
        << name;
    EXPECT_EQ(j.at("train_batch_size").get<int>(), plan.global_batch);
    const auto& z = j.at("zero_optimization");
    EXPECT_EQ(z.at("stage").get<int>(), plan.zero_stage);
    const auto& oo = z.at("offload_optimizer");
    if (oo.at("ratio").get<double>() < 1) {
      EXPECT_EQ(plan.zero_stage, 3) << name;
    }
    EXPECT_EQ(oo.at("device") == "cpu", plan.offload.optimizer);
    EXPECT_EQ(z.contains("offload_param"), plan.zero_stage == 3);
    // Every value is written out: the fp16 block is complete even when disabled.
    for (const char* k : {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale"})
      EXPECT_TRUE(j.at("fp16").contains(k)) << k;
    EXPECT_TRUE(j.at("bf16").contains("enabled"));
  }
  // What DeepSpeed cannot express is said, not approximated.
  for (const char* name : {"ddp_localsgd", "stage3_activation_offload", "offload_model"}) {
    for (const auto& [n, plan] : cases())
      if (n == name) {
        const Export e = export_deepspeed(plan, m);
        EXPECT_FALSE(e.expressible()) << name;
        EXPECT_TRUE(e.text.empty());
      }
  }
}

// DeepSpeed's ZeRO-3 keeps partitions on the device that zeroplan's executor does not (python.exports measures
// them in fp32 and bf16): the export's notes give their bytes, and tune --for deepspeed fits and ranks with them
// in the device peak (a resident item); offloaded optimizers, other stages, fp16 and other tools are not claimed.
TEST(Export, DeepSpeedZero3HoldsPartitionsBeyondThePredictionAndTuneForDeepSpeedCountsThem) {
  const ModelProfile m = small_gpt(4, 256);
  Plan plan = base(4, 2, 1);
  plan.zero_stage = 3;
  const auto memory_note = [&](const Plan& p) {
    for (const std::string& n : export_deepspeed(p, m).notes)
      if (n.rfind("memory: ", 0) == 0) return n;
    return std::string();
  };
  const std::int64_t elems = (m.total_params() + 3) / 4;
  EXPECT_EQ(tool_device_bytes_beyond_prediction("deepspeed", plan, m), 8 * elems);  // fp32: gradients and a copy
  EXPECT_NE(memory_note(plan).find(fmt::format("({} B) per rank", 8 * elems)), std::string::npos) << memory_note(plan);
  EXPECT_EQ(tool_device_bytes_beyond_prediction("fsdp2", plan, m), 0);
  plan.flat_params = true;  // contiguous_gradients: a gradient bucket of one unit (the largest) too
  std::int64_t unit = 0;
  for (const auto& u : m.units) unit = std::max(unit, u.params);
  EXPECT_EQ(tool_device_bytes_beyond_prediction("deepspeed", plan, m), 8 * elems + 4 * unit);
  EXPECT_NE(memory_note(plan).find("its contiguous gradient bucket ("), std::string::npos) << memory_note(plan);
  plan.flat_params = false;
  plan.buckets.prefetch = true;  // DeepSpeed's prefetch held more than one unit: said, not counted
  const auto notes = export_deepspeed(plan, m).notes;
  EXPECT_EQ(std::count_if(notes.begin(), notes.end(), [](const std::string& n) {
              return n.find("DeepSpeed's prefetch (stage3_prefetch_bucket_size) held more") != std::string::npos;
            }), 1);
  EXPECT_EQ(tool_device_bytes_beyond_prediction("deepspeed", plan, m), 8 * elems);
  plan.buckets.prefetch = false;
  plan.precision.param_dtype = plan.precision.compute_dtype = plan.precision.reduce_dtype = "bf16";
  EXPECT_EQ(tool_device_bytes_beyond_prediction("deepspeed", plan, m), 2 * elems);  // bf16 gradients only
  EXPECT_NE(memory_note(plan).find("its flat bf16 gradient partition ("), std::string::npos) << memory_note(plan);
  plan.precision.param_dtype = plan.precision.compute_dtype = plan.precision.reduce_dtype = "fp16";
  EXPECT_EQ(memory_note(plan), "");  // not measured
  plan.precision.param_dtype = plan.precision.compute_dtype = plan.precision.reduce_dtype = "fp32";
  plan.offload.optimizer = true;  // both partitions then live on the host
  EXPECT_EQ(memory_note(plan), "");
  plan.offload.optimizer = false;
  plan.zero_stage = 2;
  EXPECT_EQ(memory_note(plan), "");

  const ClusterProfile cluster = testing::a100(1, 1ll << 30);
  TuneConstraints c;
  c.set_global_batch(8).set_world_size(4).fix("zero_stage", "3").fix("precision", "fp32").fix("offload_optimizer", "false");
  c.set_for_tool("deepspeed");
  const TuneResult r = tune(m, cluster, c, TuneOptions{}.set_top_k(1));
  ASSERT_FALSE(r.ranking.empty());
  const RankedPlan& best = r.ranking.front();
  const std::int64_t extra = tool_device_bytes_beyond_prediction("deepspeed", best.plan, m);
  ASSERT_GT(extra, 0);
  const Prediction own = make_simulator(m, r.cluster)->simulate(best.plan);
  EXPECT_EQ(best.prediction.device.peak_bytes, own.device.peak_bytes + extra);
  EXPECT_TRUE(std::any_of(best.prediction.device.resident.begin(), best.prediction.device.resident.end(),
                          [&](const ResidentItem& i) { return i.name == kDeepSpeedPartitionsName && i.bytes == extra; }));
}

TEST(Export, AccelerateFsdpKeys) {
  const ModelProfile m = small_gpt();
  for (const auto& [name, plan] : cases()) {
    const Export v1 = export_accelerate_fsdp(plan, m, 2, "cuda");
    const Export v2 = export_accelerate_fsdp2(plan, m, 2, "cuda");
    if (v1.expressible()) {
      const int strategy = plan.zero_stage == 0 ? 3 : plan.zero_stage == 3 && plan.reshard_after_forward ? 1 : 2;
      EXPECT_NE(v1.text.find(fmt::format("  fsdp_sharding_strategy: {}\n", strategy)), std::string::npos) << name;
      EXPECT_NE(v1.text.find(fmt::format("  fsdp_offload_params: {}\n", plan.offload.params)), std::string::npos) << name;
      EXPECT_NE(v1.text.find("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"), std::string::npos);
      EXPECT_NE(v1.text.find("  fsdp_transformer_layer_cls_to_wrap: TransformerBlock\n"), std::string::npos);
      EXPECT_EQ(v1.text.find("fsdp_reshard_after_forward"), std::string::npos);
    }
    if (v2.expressible()) {
      EXPECT_NE(v2.text.find("  fsdp_version: 2\n"), std::string::npos);
      EXPECT_NE(v2.text.find(fmt::format("  fsdp_reshard_after_forward: {}\n", plan.zero_stage == 3 && plan.reshard_after_forward)),
                std::string::npos);
      EXPECT_EQ(v2.text.find("fsdp_sharding_strategy"), std::string::npos);
    }
    if (plan.zero_stage == 1 || plan.localsgd() || plan.offload_model.enabled || plan.offload.activations_ratio > 0) {
      EXPECT_FALSE(v1.expressible()) << name;
      EXPECT_FALSE(v2.expressible()) << name;
    }
  }
}

const Plan& case_named(const std::string& name) {
  static const auto all = cases();
  for (const auto& [n, p] : all)
    if (n == name) return p;
  throw std::logic_error("no export case " + name);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// SlowMo: fairscale's arguments, the slow buffers whole on every rank (as simulated), no no_sync (SlowMo
// DDP has none), the warm-up said. DeepSpeed and Accelerate say in one line why they cannot.
TEST(Export, SlowMoIsFairscaleOnly) {
  const ModelProfile m = small_gpt();
  const Plan& p = case_named("slowmo_lr_warmup");
  const Export f = export_fairscale(p, m, 8);
  ASSERT_TRUE(f.expressible());
  for (const char* part : {"SlowMoDistributedDataParallel(", "nprocs_per_node=8,", "localsgd_frequency=3,", "slowmo_momentum=0.2,",
                           "slowmo_lr=0.7,", "slowmo_frequency=6,", "slowmo_memory_efficient=False,",
                           "model.perform_slowmo(optimizer)"})
    EXPECT_TRUE(has(f.text, part)) << part;
  EXPECT_FALSE(has(f.text, "no_sync"));
  bool warm = false;
  for (const auto& n : f.notes) warm = warm || has(n, "localsgd_warmup_steps 100");
  EXPECT_TRUE(warm);
  // LocalSGD without SlowMo: fairscale's update off (momentum 0, slow lr 1).
  Plan local = p;
  local.slowmo_frequency = 0;
  local.slowmo_momentum = 0;
  local.slowmo_lr = 1;
  const Export l = export_fairscale(local, m, 8);
  EXPECT_TRUE(has(l.text, "slowmo_momentum=0,") && has(l.text, "slowmo_lr=1,")) << l.text;
  for (const Export& e : {export_deepspeed(p, m), export_accelerate_fsdp(p, m, 2, "cuda"), export_accelerate_fsdp2(p, m, 2, "cuda")}) {
    EXPECT_FALSE(e.expressible()) << e.tool;
    int lines = 0;
    for (const auto& u : e.unsupported) lines += has(u, "LocalSGD / SlowMo: ") ? 1 : 0;
    EXPECT_EQ(lines, 1) << e.tool;
  }
}

// AdaScale wraps the SGD optimizer with the world size and the accumulation; the loop reads the gain.
TEST(Export, AdaScaleWrapsSgdInFairscaleOnly) {
  const ModelProfile m = small_gpt();
  const Plan& p = case_named("ddp_adascale");
  const Export f = export_fairscale(p, m, 8);
  ASSERT_TRUE(f.expressible());
  EXPECT_TRUE(has(f.text, "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0)\n"
                          "optimizer = AdaScale(optimizer, world_size=8, num_gradients_to_accumulate=2)\n"))
      << f.text;
  EXPECT_TRUE(has(f.text, "gain = optimizer.gain()"));
  Plan stage2 = p;
  stage2.zero_stage = 2;
  EXPECT_FALSE(export_fairscale(stage2, m, 8).expressible());
  Plan alone = p;  // one gradient per step: fairscale's AdaScale raises
  alone.world_size = 1;
  alone.microbatches = 1;
  alone.global_batch = 2;
  EXPECT_FALSE(export_fairscale(alone, m, 8).expressible());
  for (const Export& e : {export_deepspeed(p, m), export_accelerate_fsdp(p, m, 2, "cuda")}) {
    EXPECT_FALSE(e.expressible()) << e.tool;
    int lines = 0;
    for (const auto& u : e.unsupported) lines += has(u, "AdaScale: ") ? 1 : 0;
    EXPECT_EQ(lines, 1) << e.tool;
  }
}

// Checkpoint offload: fairscale's checkpoint_wrapper(offload_to_cpu=True), DeepSpeed's cpu_checkpointing;
// Accelerate has no setting for it.
TEST(Export, CheckpointOffload) {
  const ModelProfile m = small_gpt();
  const Plan& p = case_named("stage2_checkpoint_offload");
  const Export f = export_fairscale(p, m, 8);
  EXPECT_TRUE(has(f.text, "units = [checkpoint_wrapper(u, offload_to_cpu=True) for u in units]")) << f.text;
  const auto ds = nlohmann::json::parse(export_deepspeed(p, m).text);
  EXPECT_EQ(ds.at("activation_checkpointing").at("cpu_checkpointing"), true);
  Plan kept = p;
  kept.checkpoint_offload = false;
  EXPECT_EQ(nlohmann::json::parse(export_deepspeed(kept, m).text).at("activation_checkpointing").at("cpu_checkpointing"), false);
  EXPECT_FALSE(has(export_fairscale(kept, m, 8).text, "offload_to_cpu"));
  Plan some = p;
  some.checkpointing = Checkpointing{Checkpointing::Mode::units, {1}};
  EXPECT_TRUE(has(export_fairscale(some, m, 8).text, "units[i] = checkpoint_wrapper(units[i], offload_to_cpu=True)"));
  EXPECT_FALSE(export_accelerate_fsdp(p, m, 1, "cuda").expressible());
}

TEST(Export, FairscaleUsesTheWrapperOfEachStage) {
  const ModelProfile m = small_gpt();
  for (const auto& [name, plan] : cases()) {
    const Export e = export_fairscale(plan, m, 8);
    if (!e.expressible()) continue;
    std::string want = "DistributedDataParallel(model";
    if (plan.offload_model.enabled) want = "OffloadModel(";
    else if (plan.localsgd()) want = "SlowMoDistributedDataParallel(";
    else if (plan.pipeline_stages > 1) want = "model = Pipe(";
    else if (plan.zero_stage == 3) want = "FullyShardedDataParallel as FSDP";
    else if (plan.zero_stage == 2) want = "ShardedDataParallel(model, optimizer";
    else if (plan.zero_stage == 1) want = "OSS(";
    EXPECT_NE(e.text.find(want), std::string::npos) << name;
  }
}

// Pipelines: DeepSpeed's PipelineEngine expresses 1F1B at ZeRO 0-1 on its uniform split; fairscale Pipe
// expresses GPipe on one node's devices; otherwise one line says why.
TEST(Export, PipelinesGoWhereTheirScheduleRuns) {
  const ModelProfile m = small_gpt();
  Plan p = base(8, 2, 4);
  p.world_size = 16;
  p.pipeline_stages = 2;
  p.pipeline.schedule = "1f1b";
  const Export ds = export_deepspeed(p, m);
  ASSERT_TRUE(ds.expressible()) << ds.unsupported.front();
  EXPECT_NE(notes_text(ds).find("PipelineModule(layers=units, num_stages=2, partition_method=\"uniform\""), std::string::npos);
  const Export fs = export_fairscale(p, m, 8);
  ASSERT_EQ(fs.unsupported.size(), 1u);
  EXPECT_EQ(fs.unsupported[0], "fairscale Pipe runs the GPipe schedule only; the plan's schedule is 1f1b (DeepSpeed's "
                               "PipelineEngine runs it)");
  p.zero_stage = 2;
  const Export ds2 = export_deepspeed(p, m);
  ASSERT_FALSE(ds2.expressible());
  EXPECT_EQ(ds2.unsupported[0].rfind("DeepSpeed's PipelineEngine runs ZeRO stages 0-1 only (plan: stage 2)", 0), 0u);
  p.zero_stage = 0;
  p.pipeline.schedule = "gpipe";
  p.pipeline.balance = {PipelineBalance::Mode::units, {1, 5}};
  const Export gp = export_deepspeed(p, m);
  ASSERT_EQ(gp.unsupported.size(), 2u);
  EXPECT_EQ(gp.unsupported[0], "DeepSpeed's PipelineEngine runs its 1F1B TrainSchedule only; the plan's schedule is gpipe");
  EXPECT_EQ(gp.unsupported[1], "balance [1,5] is not DeepSpeed's partition_method \"uniform\" ([3,3]); its \"parameters\" and "
                               "\"type:\" methods balance other weights");
  const Export pipe = export_fairscale(p, m, 8);
  ASSERT_TRUE(pipe.expressible());
  EXPECT_NE(pipe.text.find("    balance=[1, 5],\n    devices="), std::string::npos) << pipe.text;
  EXPECT_NE(pipe.text.find("    chunks=4,\n"), std::string::npos);
  p.pipeline_stages = 16;
  p.global_batch = 8;  // micro 2 x 4 microbatches x 1 pipeline
  p.pipeline.balance = {};
  EXPECT_EQ(export_fairscale(p, testing::small_gpt(14), 8).unsupported.at(0),
            "fairscale Pipe puts a pipeline's stages on one process's devices: 16 stages > 8 devices per node");
}

// tune --for TOOL ranks only plans TOOL's export can write, and says how many it left out; the same tune
// without --for ranks plans FSDP2 cannot express (partial activation offload, partial offload, stage 1
// with 16-bit parameters...), so the restriction changes the result.
TEST(Export, TuneForAToolRanksOnlyWhatItsExportCanWrite) {
  const ModelProfile m = small_gpt(4, 256);
  const ClusterProfile cluster = testing::a100(1, 64ll << 20);  // tight: offload and checkpointing matter
  TuneConstraints c;
  c.set_global_batch(16).set_world_size(8);
  TuneOptions o;
  o.set_top_k(200).set_threads(2);
  const TuneResult any = tune(m, cluster, c, o);
  ASSERT_FALSE(any.ranking.empty());
  const bool some_inexpressible = std::any_of(any.ranking.begin(), any.ranking.end(), [&](const RankedPlan& p) {
    return !expressible_by("fsdp2", p.plan, m, any.cluster);
  });
  EXPECT_TRUE(some_inexpressible);
  for (const std::string tool : {"fsdp2", "deepspeed", "accelerate", "fairscale"}) {
    c.set_for_tool(tool);
    const TuneResult r = tune(m, cluster, c, o);
    for (const RankedPlan& p : r.ranking) EXPECT_TRUE(expressible_by(tool, p.plan, m, r.cluster)) << tool;
    EXPECT_GT(r.rejections.invalid.count("not expressible by " + tool), 0u) << tool;
  }
  c.set_for_tool("fsdp2");
  const TuneResult fsdp2 = tune(m, cluster, c, o);
  ASSERT_FALSE(fsdp2.ranking.empty());
  EXPECT_TRUE(export_fsdp2_script(fsdp2.ranking.front().plan, m).expressible());
  c.set_for_tool("megatron");
  EXPECT_THROW(validate(c), SchemaError);
}

// Accelerate's FSDP needs accelerators: on a CPU cluster both of its exports say why and write nothing, and
// `tune --for accelerate` refuses in one line (python.exports once "trained" the config on 2 CPU ranks: each
// rank was an undistributed run of the whole model).
TEST(Export, AccelerateIsRefusedOnCpus) {
  const ModelProfile m = small_gpt(4, 256);
  Plan p = base(2, 2, 1);
  p.zero_stage = 3;
  for (const Export& e : {export_accelerate_fsdp(p, m, 1, "cpu"), export_accelerate_fsdp2(p, m, 1, "cpu")}) {
    EXPECT_FALSE(e.expressible()) << e.tool;
    EXPECT_TRUE(e.text.empty());
    EXPECT_EQ(e.unsupported, std::vector<std::string>{kAccelerateNeedsAccelerators});
  }
  EXPECT_TRUE(export_accelerate_fsdp(p, m, 1, "cuda").expressible());
  EXPECT_TRUE(export_accelerate_fsdp2(p, m, 1, "cuda").expressible());
  ClusterProfile cpus = testing::a100(1, 64ll << 20);
  cpus.name = "local";
  cpus.device.kind = "cpu";
  TuneConstraints c;
  c.set_global_batch(4).set_world_size(2).set_for_tool("accelerate");
  try {
    tune(m, cpus, c, TuneOptions{});
    ADD_FAILURE() << "tune --for accelerate ran on CPUs";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::not_possible_here);
    EXPECT_NE(std::string(e.what()).find("the cluster local is of CPUs"), std::string::npos) << e.what();
  }
  c.set_for_tool("fsdp2");
  EXPECT_FALSE(tune(m, cpus, c, TuneOptions{}).ranking.empty());
}

// The FSDP2 script: fully_shard per repeated unit class, the plan's constants, and what it cannot do.
TEST(Export, Fsdp2ScriptConstantsAndRefusals) {
  const ModelProfile m = small_gpt(4, 256);
  Plan p = base(4, 2, 3);
  p.zero_stage = 3;
  p.reshard_after_forward = true;
  p.precision.param_dtype = p.precision.compute_dtype = "bf16";
  p.precision.reduce_dtype = "fp32";
  p.checkpointing.mode = Checkpointing::Mode::units;
  p.checkpointing.units = {1};  // the TransformerBlock unit (x4): exactly the blocks
  Export e = export_fsdp2_script(p, m);
  ASSERT_TRUE(e.expressible()) << fmt::format("{}", fmt::join(e.unsupported, "; "));
  for (const char* line : {"WORLD_SIZE = 4\n", "MICRO_BATCH = 2\n", "MICROBATCHES = 3\n", "ZERO_STAGE = 3\n",
                           "RESHARD_AFTER_FORWARD = True\n", "PARAM_DTYPE = torch.bfloat16\n",
                           "REDUCE_DTYPE = torch.float32\n", "OFFLOAD = False\n", "CHECKPOINT = True\n",
                           "UNIT_CLASSES = (\"TransformerBlock\",)\n"})
    EXPECT_NE(e.text.find(line), std::string::npos) << line;
  EXPECT_EQ(repeated_unit_classes(m), std::vector<std::string>{"TransformerBlock"});
  p.offload.activations_ratio = 0.5;
  EXPECT_FALSE(export_fsdp2_script(p, m).expressible());
  p.offload.activations_ratio = 0;
  p.offload.params = true;  // alone: CPUOffloadPolicy moves all three
  EXPECT_FALSE(export_fsdp2_script(p, m).expressible());
  p.offload.grads = p.offload.optimizer = true;
  EXPECT_TRUE(export_fsdp2_script(p, m).expressible());
  p.checkpointing.units = {0, 1};  // the embedding too: not a unit class the script wraps
  EXPECT_FALSE(export_fsdp2_script(p, m).expressible());
}

}  // namespace
}  // namespace zeroplan::tuner
