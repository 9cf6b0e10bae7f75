// The executor's pieces that cross ranks besides collectives, on their own (pieces_rig.h): Pipeline
// (stage-major ranks, the schedule, activations and gradients between stages, the tied embedding's
// gradient and update) with its stages driven on one thread through a Mailbox, and Checkpoint (shards
// saved by two fake ranks, resumed resharded on one).
#include <unistd.h>

#include <filesystem>

#include "pieces_rig.h"
#include "zeroplan/exec/exec_errors.h"

namespace zeroplan::exec {
namespace {

using piece_rig::Mailbox;
using piece_rig::MirrorCommunicator;

Plan pipelined(int world, std::vector<int> balance, const std::string& schedule = "1f1b", int microbatches = 4) {
  Plan p;
  p.world_size = world;
  p.pipeline_stages = static_cast<int>(balance.size());
  p.pipeline.balance.mode = PipelineBalance::Mode::units;
  p.pipeline.balance.units = std::move(balance);
  p.pipeline.schedule = schedule;
  p.micro_batch = 2;
  p.microbatches = microbatches;
  p.global_batch = p.data_parallel_size() * p.micro_batch * microbatches;
  return p;
}

// Ranks are stage-major (rank = stage x dp + replica): each rank's stage, units, data-parallel group and
// schedule, as the simulator lays them out.
TEST(PipelinePiece, StageMajorRanksTheirUnitsGroupAndSchedule) {
  const Plan plan = pipelined(4, {1, 3});
  for (int r = 0; r < 4; ++r) {
    MirrorCommunicator world(r, 4);
    pieces::Pipeline pp(plan, 4, world);
    const int stage = r / 2;
    EXPECT_EQ(pp.stage(), stage) << "rank " << r;
    EXPECT_EQ(pp.first(), stage == 0);
    EXPECT_EQ(pp.last(), stage == 1);
    const pieces::StageUnits units = pp.units();
    EXPECT_EQ(units.first, stage == 0 ? 0 : 1);
    EXPECT_EQ(units.count, stage == 0 ? 1 : 3);
    EXPECT_EQ(units.input_grad, stage == 1) << "a later stage's input carries a gradient back";
    EXPECT_EQ(pp.dp().world_size(), 2);
    EXPECT_EQ(pp.dp().rank(), r % 2);
    const std::vector<PipelineOp> want = pipeline_order("1f1b", 2, stage, 4);
    ASSERT_EQ(pp.order().size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(pp.order()[i].forward, want[i].forward);
      EXPECT_EQ(pp.order()[i].microbatch, want[i].microbatch);
    }
  }
}

// A balance the executor cannot run is refused in one line naming the numbers.
TEST(PipelinePiece, RefusesABalanceThatIsNotTheModelsUnits) {
  MirrorCommunicator world(0, 2);
  try {
    pieces::Pipeline pp(pipelined(2, {1, 2}), 4, world);
    FAIL() << "a balance over 3 of 4 units ran";
  } catch (const ExecError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.balance has 2 stages over 3 units; the plan has 2 stages and the model 4 units"),
              std::string::npos)
        << e.what();
  }
  Plan by_time = pipelined(2, {2, 2});
  by_time.pipeline.balance.mode = PipelineBalance::Mode::time;
  EXPECT_THROW(pieces::Pipeline(by_time, 4, world), ExecError);
}

// Two stages of gpt2-tiny (units 0-1 and 2-3) on ranks 0 and 1, driven on one thread.
struct TwoStages {
  explicit TwoStages(int zero_stage = 0)
      : plan([&] {
          Plan p = pipelined(2, {2, 2}, "gpipe", 2);
          p.zero_stage = zero_stage;
          return p;
        }()),
        model0(zoo::build_model("gpt", "gpt2-tiny", {}, 0)),
        model1(zoo::build_model("gpt", "gpt2-tiny", {}, 0)),
        world0(0, 2, &mail),
        world1(1, 2, &mail),
        pp0(plan, 4, world0),
        pp1(plan, 4, world1),
        dev(make_device("cpu")),
        rec0(0, false),
        rec1(1, false),
        c0(model0, plan, pp0.dp(), *dev, rec0, 0, pp0.units()),
        c1(model1, plan, pp1.dp(), *dev, rec1, 0, pp1.units()) {
    pp0.attach(c0, model0);
    pp1.attach(c1, model1);
  }
  Plan plan;
  Mailbox mail;
  zoo::Model model0, model1;
  MirrorCommunicator world0, world1;
  pieces::Pipeline pp0, pp1;
  std::unique_ptr<Device> dev;
  Recorder rec0, rec1;
  pieces::Ctx c0, c1;
};

// An activation goes forward with its shape and dtype (a header before it), its gradient comes back in the
// shape sent; the last stage's loss reaches the first; every send is waited at the end of the step.
TEST(PipelinePiece, ActivationsGradientsAndTheLossCrossStages) {
  TwoStages s;
  const torch::Tensor y = torch::randn({2, 32, 64});
  s.pp0.send_output(0, y);
  s.pp0.send_output(1, y.to(torch::kBFloat16));
  const torch::Tensor x0 = s.pp1.recv_input(0);
  const torch::Tensor x1 = s.pp1.recv_input(1);
  EXPECT_TRUE(torch::equal(x0, y));
  EXPECT_EQ(x1.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(x1.sizes(), y.sizes());
  const torch::Tensor g = torch::randn({2, 32, 64}).to(torch::kBFloat16);
  s.pp1.send_grad(1, g);
  const torch::Tensor back = s.pp0.recv_grad(1);
  EXPECT_EQ(back.sizes(), y.sizes());
  EXPECT_TRUE(torch::equal(back, g));
  EXPECT_EQ(s.pp1.share_loss(2.5), 2.5);
  EXPECT_EQ(s.pp0.share_loss(0.0), 2.5) << "the first stage reports the last stage's loss";
  s.pp0.finish_step();
  s.pp1.finish_step();
  EXPECT_EQ(s.mail.pending(), 0u);
}

// The GPT head on the last stage uses the token embedding owned by the first: the last stage keeps a
// replica; at stage 0 its gradient goes to the owner once, after the last microbatch (zeroed on the
// borrower), the owner adds it to its own; after the step the owner's weight is copied into the replica.
TEST(PipelinePiece, TiedEmbeddingGradientGoesToItsOwnerAndTheUpdateComesBack) {
  TwoStages s;
  const pieces::UnitRT& head = s.c1.unit(1);
  ASSERT_EQ(head.replicas.size(), 1u);
  const pieces::TiedReplica& rep = head.replicas[0];
  const ParamSlot* owned = s.c0.unit(0).flat.find(rep.owner_name);
  ASSERT_NE(owned, nullptr);
  ASSERT_EQ(owned->numel, rep.numel);
  pieces::ParamResidency params0(s.c0), params1(s.c1);
  pieces::GradSync grads0(s.c0), grads1(s.c1);
  grads0.zero();
  grads1.zero();
  grads1.region(1).narrow(0, rep.offset, rep.numel).fill_(3.0);
  grads0.region(0).narrow(0, owned->offset, owned->numel).fill_(1.0);

  s.pp1.tied_grads_out(1, grads1, /*last_micro=*/false);
  EXPECT_EQ(s.mail.pending(), 0u) << "stage 0: nothing before the last microbatch";
  s.pp1.tied_grads_out(1, grads1, true);
  EXPECT_TRUE(torch::equal(grads1.region(1).narrow(0, rep.offset, rep.numel), torch::zeros({rep.numel})));
  s.pp0.tied_grads_in(0, grads0, true);
  EXPECT_TRUE(torch::equal(grads0.region(0).narrow(0, owned->offset, owned->numel), torch::full({rep.numel}, 4.0)));

  params0.flat().narrow(0, s.c0.unit(0).base + owned->offset, owned->numel).fill_(7.0);
  s.pp0.tied_params_after_step(params0);
  s.pp1.tied_params_after_step(params1);
  EXPECT_TRUE(torch::equal(params1.flat().narrow(0, s.c1.unit(1).base + rep.offset, rep.numel), torch::full({rep.numel}, 7.0)));
  s.pp0.finish_step();
  s.pp1.finish_step();
  EXPECT_EQ(s.mail.pending(), 0u);
}

// One rank's pieces for a checkpoint: parameters, gradients, precision, optimizer.
struct Saver {
  explicit Saver(piece_rig::Rig& rig)
      : params(*rig.c), grads(*rig.c), precision(*rig.c), opt(*rig.c, params, grads, precision),
        ck(*rig.c, params, opt, precision) {}
  pieces::ParamResidency params;
  pieces::GradSync grads;
  pieces::Precision precision;
  pieces::OptimizerStep opt;
  pieces::Checkpoint ck;
};

// Stage 3 on two ranks: each saves its shard (changed: +1 on rank 0, +2 on rank 1), rank 0 last (its
// manifest lists both files). One rank at stage 0 resumes the whole model resharded: each element as the
// rank that owned it saved it. Another run's checkpoint (another seed) is refused unless asked for.
TEST(CheckpointPiece, TwoRanksShardsResumeOnOneRankAtStageZero) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("zeroplan_pieces_ck_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "step-5");  // rank 0 makes it before the others write, in a real world
  auto stage3 = [](Plan& p) { p.zero_stage = 3; };
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> owned(2);  // per rank, per unit: shard begin, size
  for (const int r : {1, 0}) {
    piece_rig::Rig rig(stage3, "gpt", "gpt2-tiny", {}, r, 2);
    Saver s(rig);
    s.params.flat().add_(1.0 + r);
    for (const auto& U : rig.c->units) owned[static_cast<std::size_t>(r)].push_back({U.shard_begin(r), U.shard()});
    s.ck.save(dir.string(), 5);
  }
  // The same data order (global batch 4): two microbatches of 2 on the one rank.
  piece_rig::Rig one([](Plan& p) { p.microbatches = 2; }, "gpt", "gpt2-tiny", {}, 0, 1);
  Saver s(one);
  const torch::Tensor fresh = s.params.flat().clone();  // as built, before the resume
  EXPECT_EQ(s.ck.load(dir.string()), 5);
  for (int u = 0; u < one.c->unit_count(); ++u) {
    const pieces::UnitRT& U = one.c->unit(u);
    torch::Tensor want = fresh.narrow(0, U.base, U.numel()).clone();
    for (int r = 0; r < 2; ++r) {
      const auto [begin, size] = owned[static_cast<std::size_t>(r)][static_cast<std::size_t>(u)];
      const std::int64_t n = std::min(size, U.numel() - begin);
      if (n > 0) want.narrow(0, begin, n).add_(1.0 + r);
    }
    EXPECT_TRUE(torch::equal(s.params.flat().narrow(0, U.base, U.numel()), want)) << "unit " << U.name;
  }

  piece_rig::Rig other([](Plan& p) {
    p.microbatches = 2;
    p.seed = 7;
  }, "gpt", "gpt2-tiny", {}, 0, 1);
  Saver o(other);
  try {
    o.ck.load(dir.string());
    FAIL() << "another seed's checkpoint resumed";
  } catch (const ExecError& e) {
    EXPECT_NE(std::string(e.what()).find("seed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(o.ck.load(dir.string(), /*other_run=*/true), 5);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zeroplan::exec
