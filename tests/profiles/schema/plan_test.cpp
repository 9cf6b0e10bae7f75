#include "zeroplan/profiles/plan.h"

#include "schema_test_util.h"

namespace zeroplan {
namespace {

using testing::expect_error;
using testing::sample_model;
using testing::sample_plan;

TEST(Plan, DefaultDdp) {
  const Plan p = Plan::default_ddp(4, 32);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.micro_batch, 8);
  EXPECT_EQ(p.microbatches, 1);
  EXPECT_EQ(p.zero_stage, 0);
  EXPECT_FALSE(p.reshard_after_forward);
  EXPECT_EQ(p.buckets.all_reduce_bucket_bytes, 25 * 1024 * 1024);
  EXPECT_EQ(p.buckets.reduce_buffer_elems, 1 << 23);
  EXPECT_EQ(p.optimizer.states_per_param(), 2);
  validate(p);
  expect_error([] { Plan::default_ddp(4, 10); }, "plan: global_batch 10 is not a positive multiple of world_size 4");
  expect_error([] { Plan::default_ddp(0, 10); }, "plan: world_size must be >= 1 (got 0)");
}

TEST(Plan, RoundTrip) {
  testing::expect_round_trip(sample_plan());
  testing::expect_round_trip(Plan::default_ddp(1, 1));
  Plan all = Plan::default_ddp(2, 4);
  all.checkpointing.mode = Checkpointing::Mode::all;
  all.precision.loss_scale.mode = LossScale::Mode::dynamic;
  all.precision.compute_dtype = "fp16";
  testing::expect_round_trip(all);
}

TEST(Plan, MinimalDocumentGetsDefaults) {
  const Plan p = parse_document<Plan>(
      R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 8, "micro_batch": 4, "microbatches": 1,
          "zero_stage": 3})");
  EXPECT_TRUE(p.reshard_after_forward);  // FSDP FULL_SHARD default at stage 3
  EXPECT_EQ(p.checkpointing.mode, Checkpointing::Mode::none);
  EXPECT_EQ(p.optimizer.name, "adam");
  const Plan q = parse_document<Plan>(
      R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 8, "micro_batch": 4, "microbatches": 1,
          "zero_stage": 2, "checkpointing": [1, 3], "precision": {"loss_scale": "dynamic", "compute_dtype": "fp16"}})");
  EXPECT_FALSE(q.reshard_after_forward);
  EXPECT_TRUE(q.checkpointing.applies_to(3));
  EXPECT_FALSE(q.checkpointing.applies_to(2));
  EXPECT_EQ(q.precision.loss_scale.mode, LossScale::Mode::dynamic);
}

TEST(Plan, UnknownKeyWithSuggestion) {
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 8, "micro_batch": 4,
                                 "microbatches": 1, "zero_stag": 3})");
      },
      "<string>: plan: unknown key \"zero_stag\" (did you mean \"zero_stage\"?)");
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 8, "micro_batch": 4,
                                 "microbatches": 1, "zero_stage": 3, "offload": {"param": true}})");
      },
      "<string>: plan.offload: unknown key \"param\" (did you mean \"params\"?)");
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 8, "micro_batch": 4,
                                 "microbatches": 1, "zero_stage": 3, "colour": "blue"})");
      },
      "<string>: plan: unknown key \"colour\"");
}

TEST(Plan, MissingKeysAreNamed) {
  expect_error([] { parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2, "micro_batch": 4})"); },
               "<string>: plan: missing required keys \"global_batch\", \"microbatches\", \"zero_stage\"");
}

TEST(Plan, WrongSchemaAndTypes) {
  expect_error([] { parse_document<Plan>(R"({"schema": "zeroplan.cluster/1"})"); },
               "<string>: plan: schema is string \"zeroplan.cluster/1\", expected \"zeroplan.plan/1\"");
  expect_error([] { parse_document<Plan>(R"({"world_size": 2})"); },
               "<string>: plan: missing \"schema\" (expected \"zeroplan.plan/1\")");
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": "2", "global_batch": 8, "micro_batch": 4,
                                 "microbatches": 1, "zero_stage": 0})");
      },
      "<string>: plan.world_size: expected an integer, got string \"2\"");
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2.5, "global_batch": 8, "micro_batch": 4,
                                 "microbatches": 1, "zero_stage": 0})");
      },
      "<string>: plan.world_size: expected an integer, got number 2.5");
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 8, "micro_batch": 4,
                                 "microbatches": 1, "zero_stage": 0, "checkpointing": "some"})");
      },
      "<string>: plan.checkpointing: expected \"none\", \"all\" or an array of unit indices, got string \"some\"");
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 8, "micro_batch": 4,
                                 "microbatches": 1, "zero_stage": 0, "precision": {"loss_scale": true}})");
      },
      "<string>: plan.precision.loss_scale: expected \"none\", \"dynamic\" or a number, got boolean true");
}

class PlanRule : public ::testing::TestWithParam<testing::Rule<Plan>> {};

TEST_P(PlanRule, MessageIsExact) {
  Plan p = Plan::default_ddp(2, 8);
  GetParam().mutate(p);
  expect_error([&] { validate(p); }, GetParam().message);
  // Reading a document with the same content gives the same error, prefixed by the origin.
  if (!GetParam().survives_json) return;
  const nlohmann::json j = p;
  expect_error([&] { j.get<Plan>(); }, GetParam().message);
}

const testing::Rule<Plan> kPlanRules[] = {
    {"BatchIdentity",
     [](Plan& p) {
       p.global_batch = 33;
       p.micro_batch = 17;
       p.microbatches = 2;
     },
     "plan: global_batch 33 != micro_batch 17 x microbatches 2 x world_size 2 (= 68)"},
    {"BatchIdentityPipelined",
     [](Plan& p) {
       p.world_size = 4;
       p.pipeline_stages = 2;
       p.global_batch = 10;
       p.micro_batch = 2;
       p.microbatches = 4;
     },
     "plan: global_batch 10 != micro_batch 2 x microbatches 4 x data-parallel size 2 (world_size 4 / pipeline_stages 2) "
     "(= 16)"},
    {"WorldSize", [](Plan& p) { p.world_size = 0; }, "plan: world_size must be >= 1 (got 0)"},
    {"MicroBatch", [](Plan& p) { p.micro_batch = 0; }, "plan: micro_batch must be >= 1 (got 0)"},
    {"Microbatches", [](Plan& p) { p.microbatches = -1; }, "plan: microbatches must be >= 1 (got -1)"},
    {"PipelineStages", [](Plan& p) { p.pipeline_stages = 0; }, "plan: pipeline_stages must be >= 1 (got 0)"},
    {"PipelineDivides", [](Plan& p) { p.pipeline_stages = 3; }, "plan: world_size 2 is not a multiple of pipeline_stages 3"},
    {"PipelineSchedule", [](Plan& p) { p.pipeline.schedule = "zb"; },
     "plan: pipeline.schedule must be \"gpipe\" or \"1f1b\" (got \"zb\")"},
    {"PipelineCheckpointName", [](Plan& p) { p.pipeline.checkpoint = "some"; },
     "plan: pipeline.checkpoint must be \"always\", \"except_last\" or \"never\" (got \"some\")"},
    {"PipelineCheckpointNeedsStages", [](Plan& p) { p.pipeline.checkpoint = "always"; },
     "plan: pipeline.checkpoint \"always\" requires pipeline_stages > 1 (got 1)"},
    {"PipelineCheckpointGpipeOnly",
     [](Plan& p) {
       p.pipeline_stages = 2;
       p.micro_batch = 8;
       p.pipeline.schedule = "1f1b";
       p.pipeline.checkpoint = "except_last";
     },
     "plan: pipeline.checkpoint \"except_last\" requires pipeline.schedule \"gpipe\" (got \"1f1b\"; checkpoint units "
     "with checkpointing instead)"},
    {"PipelineCheckpointTwice",
     [](Plan& p) {
       p.pipeline_stages = 2;
       p.micro_batch = 8;
       p.pipeline.checkpoint = "always";
       p.checkpointing.mode = Checkpointing::Mode::all;
     },
     "plan: pipeline.checkpoint \"always\" and checkpointing \"all\" both recompute: set one of them to never / none"},
    {"PipelineBalanceLength",
     [](Plan& p) {
       p.pipeline_stages = 2;
       p.micro_batch = 8;
       p.pipeline.balance = {PipelineBalance::Mode::units, {1, 2, 3}};
     },
     "plan: pipeline.balance has 3 entries but pipeline_stages is 2"},
    {"PipelineBalanceEntry",
     [](Plan& p) {
       p.pipeline_stages = 2;
       p.micro_batch = 8;
       p.pipeline.balance = {PipelineBalance::Mode::units, {4, 0}};
     },
     "plan: pipeline.balance[1] must be >= 1 (got 0)"},
    {"PipelineZero3",
     [](Plan& p) {
       p.pipeline_stages = 2;
       p.micro_batch = 8;
       p.zero_stage = 3;
       p.reshard_after_forward = true;
     },
     "plan: pipeline_stages 2 requires zero_stage 0, 1 or 2 (got 3)"},
    {"ZeroStage", [](Plan& p) { p.zero_stage = 4; }, "plan: zero_stage must be 0, 1, 2 or 3 (got 4)"},
    {"Reshard",
     [](Plan& p) {
       p.zero_stage = 1;
       p.reshard_after_forward = true;
     },
     "plan: reshard_after_forward requires zero_stage 3 (got 1)"},
    {"OffloadParams",
     [](Plan& p) {
       p.zero_stage = 2;
       p.offload.params = true;
     },
     "plan: offload.params requires zero_stage 3 (got 2)"},
    {"OffloadOptimizer", [](Plan& p) { p.offload.optimizer = true; },
     "plan: offload.optimizer requires zero_stage 1, 2 or 3 (got 0)"},
    {"OffloadGrads",
     [](Plan& p) {
       p.zero_stage = 2;
       p.offload.grads = true;
     },
     "plan: offload.grads requires offload.optimizer (the host optimizer consumes the gradients)"},
    {"ActivationsRatio", [](Plan& p) { p.offload.activations_ratio = 1.5; },
     "plan: offload.activations_ratio must be in [0, 1] (got 1.5)"},
    {"OffloadModelSlices",
     [](Plan& p) {
       p.offload_model.enabled = true;
       p.offload_model.slices = 0;
     },
     "plan: offload_model.slices must be >= 1 (got 0)"},
    {"OffloadModelMicrobatches",
     [](Plan& p) {
       p.offload_model.enabled = true;
       p.offload_model.microbatches = 0;
     },
     "plan: offload_model.microbatches must be >= 1 (got 0)"},
    {"OffloadModelDivides",
     [](Plan& p) {
       p.offload_model.enabled = true;
       p.offload_model.microbatches = 3;
     },
     "plan: offload_model.microbatches 3 does not divide micro_batch 4"},
    {"OffloadModelStage",
     [](Plan& p) {
       p.offload_model.enabled = true;
       p.zero_stage = 1;
     },
     "plan: offload_model requires zero_stage 0 (got 1)"},
    {"OffloadModelPipeline",
     [](Plan& p) {
       p.offload_model.enabled = true;
       p.pipeline_stages = 2;
       p.global_batch = 4;
     },
     "plan: offload_model requires pipeline_stages 1 (got 2)"},
    {"CheckpointEmpty", [](Plan& p) { p.checkpointing.mode = Checkpointing::Mode::units; },
     "plan: checkpointing: empty list of units (use \"none\")"},
    {"CheckpointNegative", [](Plan& p) { p.checkpointing = Checkpointing{Checkpointing::Mode::units, {-1}}; },
     "plan: checkpointing: unit index -1 is negative"},
    {"CheckpointOrder", [](Plan& p) { p.checkpointing = Checkpointing{Checkpointing::Mode::units, {2, 2}}; },
     "plan: checkpointing: unit indices must be strictly increasing (2 then 2)"},
    {"CheckpointUnitsWithAll", [](Plan& p) { p.checkpointing = Checkpointing{Checkpointing::Mode::all, {1}}; },
     "plan: checkpointing: unit list given with mode none or all", false},
    {"CheckpointOffloadNeedsCheckpointing", [](Plan& p) { p.checkpoint_offload = true; },
     "plan: checkpoint_offload requires checkpointing (got \"none\"): it offloads the checkpointed units' inputs"},
    {"CheckpointOffloadWithOffloadModel",
     [](Plan& p) {
       p.checkpointing.mode = Checkpointing::Mode::all;
       p.checkpoint_offload = true;
       p.offload_model.enabled = true;
     },
     "plan: checkpoint_offload requires offload_model off (OffloadModel keeps its own activations: "
     "offload_model.checkpoint_activation)"},
    {"OffloadModelWithCheckpointing",
     [](Plan& p) {
       p.checkpointing.mode = Checkpointing::Mode::all;
       p.offload_model.enabled = true;
     },
     "plan: offload_model requires checkpointing none (OffloadModel checkpoints whole slices: "
     "offload_model.checkpoint_activation)"},
    {"OffloadModelWithActivationOffload",
     [](Plan& p) {
       p.offload.activations_ratio = 0.5;
       p.offload_model.enabled = true;
     },
     "plan: offload_model requires offload.activations_ratio 0 (got 0.5): OffloadModel keeps its own activations"},
    {"OffloadModelWithAdaScale",
     [](Plan& p) {
       p.optimizer.name = "sgd";
       p.adascale = true;
       p.offload_model.enabled = true;
     },
     "plan: offload_model requires synchronous data parallelism (got adascale)"},
    {"LocalSgdNegative", [](Plan& p) { p.localsgd_frequency = -1; }, "plan: localsgd_frequency must be >= 0 (got -1)"},
    {"LocalSgdWarmupNegative",
     [](Plan& p) {
       p.localsgd_frequency = 4;
       p.localsgd_warmup_steps = -1;
     },
     "plan: localsgd_warmup_steps must be >= 0 (got -1)"},
    {"LocalSgdWarmupNeedsLocalSgd", [](Plan& p) { p.localsgd_warmup_steps = 100; },
     "plan: localsgd_warmup_steps 100 requires localsgd_frequency > 1 (got 0)"},
    {"SlowMoLrPositive",
     [](Plan& p) {
       p.localsgd_frequency = 4;
       p.slowmo_frequency = 8;
       p.slowmo_lr = 0;
     },
     "plan: slowmo_lr must be > 0 (got 0.0)"},
    {"SlowMoLrNeedsLocalSgd",
     [](Plan& p) {
       p.slowmo_frequency = 8;
       p.slowmo_lr = 0.5;
     },
     "plan: slowmo (slowmo_frequency 8, slowmo_momentum 0.0, slowmo_lr 0.5) requires localsgd_frequency > 1 (got 0)"},
    {"SlowMoMomentumNeedsFrequency",
     [](Plan& p) {
       p.localsgd_frequency = 4;
       p.slowmo_momentum = 0.5;
     },
     "plan: slowmo (slowmo_momentum 0.5) requires slowmo_frequency > 0 (got 0): the slow update never runs"},
    {"LocalSgdStage",
     [](Plan& p) {
       p.localsgd_frequency = 4;
       p.zero_stage = 2;
     },
     "plan: localsgd_frequency 4 requires zero_stage 0 (got 2)"},
    {"LocalSgdPipeline",
     [](Plan& p) {
       p.localsgd_frequency = 4;
       p.pipeline_stages = 2;
       p.global_batch = 4;
     },
     "plan: localsgd_frequency 4 requires pipeline_stages 1 (got 2)"},
    {"SlowMoFrequency", [](Plan& p) { p.slowmo_frequency = -2; }, "plan: slowmo_frequency must be >= 0 (got -2)"},
    {"SlowMoMomentum", [](Plan& p) { p.slowmo_momentum = 1; }, "plan: slowmo_momentum must be in [0, 1) (got 1.0)"},
    {"SlowMoNeedsLocalSgd",
     [](Plan& p) {
       p.slowmo_frequency = 48;
       p.slowmo_momentum = 0.5;
       p.localsgd_frequency = 1;
     },
     "plan: slowmo (slowmo_frequency 48, slowmo_momentum 0.5) requires localsgd_frequency > 1 (got 1)"},
    {"OptimizerName", [](Plan& p) { p.optimizer.name = "lamb"; },
     "plan: optimizer.name must be \"adam\", \"adamw\" or \"sgd\" (got \"lamb\")"},
    {"OptimizerLr", [](Plan& p) { p.optimizer.lr = 0; }, "plan: optimizer.lr must be > 0 (got 0.0)"},
    {"OptimizerEps", [](Plan& p) { p.optimizer.eps = -1e-8; }, "plan: optimizer.eps must be > 0 (got -1e-08)"},
    {"OptimizerWeightDecay", [](Plan& p) { p.optimizer.weight_decay = -0.1; },
     "plan: optimizer.weight_decay must be >= 0 (got -0.1)"},
    {"OptimizerMomentumRange",
     [](Plan& p) {
       p.optimizer.name = "sgd";
       p.optimizer.momentum = 1.2;
     },
     "plan: optimizer.momentum must be in [0, 1) (got 1.2)"},
    {"OptimizerMomentumAdam", [](Plan& p) { p.optimizer.momentum = 0.9; },
     "plan: optimizer.momentum 0.9 is only used by sgd (got \"adam\")"},
    {"OptimizerBetas", [](Plan& p) { p.optimizer.betas = {0.9, 1.0}; },
     "plan: optimizer.betas[1] must be in [0, 1) (got 1.0)"},
    {"AdaScale", [](Plan& p) { p.adascale = true; }, "plan: adascale requires optimizer sgd (got \"adam\")"},
    {"Dtype", [](Plan& p) { p.precision.compute_dtype = "fp8"; },
     "plan: precision.compute_dtype must be \"fp32\", \"fp16\" or \"bf16\" (got \"fp8\")"},
    {"LossScaleNeeds16Bit", [](Plan& p) { p.precision.loss_scale.mode = LossScale::Mode::dynamic; },
     "plan: precision.loss_scale \"dynamic\" requires compute_dtype fp16 or bf16 (got \"fp32\")"},
    {"LossScalePositive",
     [](Plan& p) {
       p.precision.compute_dtype = "fp16";
       p.precision.loss_scale = LossScale{LossScale::Mode::fixed, -8};
     },
     "plan: precision.loss_scale must be > 0 (got -8.0)"},
    {"BroadcastFp16", [](Plan& p) { p.precision.broadcast_fp16 = true; },
     "plan: precision.broadcast_fp16 requires zero_stage 1 or 2 (got 0)"},
    {"Fp32ReduceScatterStage",
     [](Plan& p) {
       p.zero_stage = 1;
       p.precision.fp32_reduce_scatter = true;
     },
     "plan: precision.fp32_reduce_scatter requires zero_stage 2 or 3 (got 1)"},
    {"Fp32ReduceScatterDtype",
     [](Plan& p) {
       p.zero_stage = 2;
       p.precision.fp32_reduce_scatter = true;
       p.precision.reduce_dtype = "bf16";
     },
     "plan: precision.fp32_reduce_scatter requires reduce_dtype fp32 (got \"bf16\")"},
    {"Buckets", [](Plan& p) { p.buckets.allgather_bucket_bytes = 0; },
     "plan: buckets.allgather_bucket_bytes must be >= 1 (got 0)"},
};

INSTANTIATE_TEST_SUITE_P(Rules, PlanRule, ::testing::ValuesIn(kPlanRules),
                         [](const ::testing::TestParamInfo<testing::Rule<Plan>>& info) { return std::string(info.param.name); });

TEST(Plan, ValidCombinations) {
  Plan p = Plan::default_ddp(8, 64);
  p.localsgd_frequency = 3;
  p.slowmo_frequency = 48;
  p.slowmo_momentum = 0.5;
  validate(p);
  p.slowmo_lr = 0.7;
  p.localsgd_warmup_steps = 100;
  validate(p);
  EXPECT_TRUE(p.slowmo());
  p.slowmo_momentum = 0;
  p.slowmo_lr = 1;
  validate(p);
  EXPECT_FALSE(p.slowmo());  // fairscale: momentum 0 and slow lr 1 is plain LocalSGD
  Plan ckpt = Plan::default_ddp(2, 8);
  ckpt.checkpointing = Checkpointing{Checkpointing::Mode::units, {1}};
  ckpt.checkpoint_offload = true;
  validate(ckpt);
  Plan om = Plan::default_ddp(1, 8);
  om.offload_model = OffloadModel{true, 4, true, 2};
  validate(om);
  Plan z2 = Plan::default_ddp(2, 8);
  z2.zero_stage = 2;
  z2.offload.optimizer = true;
  z2.offload.grads = true;
  z2.precision.broadcast_fp16 = true;
  validate(z2);
  Plan sgd = Plan::default_ddp(2, 8);
  sgd.optimizer.name = "sgd";
  sgd.optimizer.momentum = 0.9;
  sgd.adascale = true;
  EXPECT_EQ(sgd.optimizer.states_per_param(), 1);
  validate(sgd);
}

TEST(Plan, AgainstModel) {
  const ModelProfile m = sample_model();  // 3 entries, 6 expanded units
  Plan p = Plan::default_ddp(2, 8);
  p.checkpointing = Checkpointing{Checkpointing::Mode::units, {0, 2}};
  validate(p, m);
  p.checkpointing.units = {3};
  expect_error([&] { validate(p, m); }, "plan: checkpointing: unit index 3 but model \"gpt2-tiny\" has 3 unit entries");
  Plan om = Plan::default_ddp(1, 8);
  om.offload_model = OffloadModel{true, 7, false, 1};
  expect_error([&] { validate(om, m); }, "plan: offload_model.slices 7 > 6 units of model \"gpt2-tiny\"");
  Plan pp = Plan::default_ddp(8, 8);
  pp.pipeline_stages = 8;
  pp.global_batch = 1;
  pp.micro_batch = 1;
  expect_error([&] { validate(pp, m); }, "plan: pipeline_stages 8 > 6 units of model \"gpt2-tiny\"");
  Plan pb = Plan::default_ddp(2, 8);
  pb.pipeline_stages = 2;
  pb.micro_batch = 8;
  pb.pipeline.balance = {PipelineBalance::Mode::units, {2, 4}};
  validate(pb, m);
  pb.pipeline.balance.units = {2, 5};
  expect_error([&] { validate(pb, m); }, "plan: pipeline.balance sums to 7 units but model \"gpt2-tiny\" has 6");
}

TEST(Plan, PipelineRoundTripsAndFollowsFairscaleDefaults) {
  // fairscale Pipe's default checkpoint mode is except_last; it applies to GPipe stages only.
  const Plan p = parse_document<Plan>(
      R"({"schema": "zeroplan.plan/1", "world_size": 4, "global_batch": 16, "micro_batch": 2, "microbatches": 4,
          "zero_stage": 1, "pipeline_stages": 2})");
  EXPECT_EQ(p.pipeline.checkpoint, "except_last");
  EXPECT_EQ(p.pipeline.schedule, "gpipe");
  EXPECT_EQ(p.pipeline.balance.mode, PipelineBalance::Mode::time);
  testing::expect_round_trip(p);
  const Plan q = parse_document<Plan>(
      R"({"schema": "zeroplan.plan/1", "world_size": 4, "global_batch": 16, "micro_batch": 2, "microbatches": 4,
          "zero_stage": 0, "pipeline_stages": 2, "pipeline": {"schedule": "1f1b", "balance": [1, 5]}})");
  EXPECT_EQ(q.pipeline.checkpoint, "never");
  EXPECT_EQ(q.pipeline.balance.units, (std::vector<int>{1, 5}));
  testing::expect_round_trip(q);
  EXPECT_EQ(parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 1, "global_batch": 1, "micro_batch": 1,
                                     "microbatches": 1, "zero_stage": 0})")
                .pipeline.checkpoint,
            "never");
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 2, "micro_batch": 1,
                                 "microbatches": 1, "zero_stage": 0, "pipeline_stages": 2, "pipeline": {"balance": "size"}})");
      },
      "<string>: plan.pipeline.balance: expected \"time\", \"memory\" or an array of units per stage, got string \"size\"");
}

}  // namespace
}  // namespace zeroplan
