// The executor's pieces around autograd on their own (pieces_rig.h): Activations (kept, checkpointed,
// checkpoint_offload, BatchNorm statistics around a recompute), ActivationOffload, the autograd step
// (differentiate, loss_grad), AdaScale, Precision and OffloadModel, each driven by hand on one rank of a
// fake world; a microbatch is driven as executor.cpp's plain step drives it (PlainStep).
#include <limits>

#include "zeroplan/profiles/counting_allocator.h"
#include "pieces_rig.h"
#include "zeroplan/exec/local_communicator.h"
#include "zeroplan/exec/run.h"

namespace zeroplan::exec {
namespace {

using piece_rig::Rig;
using piece_rig::total;

// The pieces of a plain step (no pipeline, no OffloadModel) and one microbatch through them, in
// executor.cpp's order: forward unit by unit, the loss, backward unit by unit into GradSync's regions.
struct PlainStep {
  explicit PlainStep(Rig& rig) : c(*rig.c), params(c), grads(c), acts(c) {
    grads.set_all_reduce_comm(&rig.comm);
    grads.zero();
  }
  // Unit outputs of microbatch k's forward (each with its graph unless checkpointed); its target in *target.
  std::vector<torch::Tensor> forward(int k, torch::Tensor* target) {
    zoo::Batch b = c.model.task->batch(0, (static_cast<std::int64_t>(c.rank) * c.plan.microbatches + k) * c.plan.micro_batch,
                                       c.plan.micro_batch);
    torch::Tensor x = pieces::model_input(c, b.input);
    *target = b.target;
    std::vector<torch::Tensor> outs;
    for (int u = 0; u < c.unit_count(); ++u) {
      params.before_fwd(u, k);
      outs.push_back(acts.forward(u, x, k));
      x = outs.back().detach();
      params.after_fwd(u);
    }
    return outs;
  }
  // Microbatch k, forward and backward, the loss's gradient times `scale`; returns the loss.
  double microbatch(int k, bool last, double scale, pieces::AdaScale* adascale = nullptr) {
    torch::Tensor target;
    std::vector<torch::Tensor> outs = forward(k, &target);
    double loss = 0;
    torch::Tensor g = pieces::loss_grad(c, outs.back().detach(), target, k, scale, loss);
    outs.clear();
    for (int u = c.unit_count() - 1; u >= 0; --u) {
      params.before_bwd(u, k);
      g = pieces::differentiate(c, u, acts.output_for_backward(u, k), acts.input(u), g,
                                [this](int owner) { return grads.region(owner); }, adascale, c.plan.grads_in_place());
      acts.after_bwd(u);
      params.after_bwd(u);
      grads.after_bwd(u, k, last);
    }
    grads.finish_microbatch();
    return loss;
  }
  pieces::Ctx& c;
  pieces::ParamResidency params;
  pieces::GradSync grads;
  pieces::Activations acts;
};

// A kept unit's output is the forward's own tensor with its graph; a checkpointed unit's forward keeps no
// graph and its recompute runs under the forward's RNG state (dropout draws the same mask although the
// RNG moved on meanwhile); after its backward the unit holds nothing.
TEST(ActivationsPiece, CheckpointedUnitsRecomputeUnderTheForwardsRngState) {
  Rig rig([](Plan& p) { p.checkpointing = {Checkpointing::Mode::units, {1}}; }, "gpt", "gpt2-tiny", {{"dropout", "0.5"}});
  PlainStep s(rig);
  torch::Tensor target;
  const std::vector<torch::Tensor> outs = s.forward(0, &target);
  EXPECT_TRUE(outs[0].requires_grad());
  EXPECT_FALSE(outs[1].requires_grad()) << "a checkpointed forward keeps no graph";
  torch::rand({1000});  // the RNG moves on before the backward
  {
    torch::NoGradGuard no_grad;  // the same forward under the RNG as it is now draws another mask
    EXPECT_FALSE(torch::equal(rig.c->unit(1).module->forward(s.acts.input(1)), outs[1]));
  }
  const torch::Tensor again = s.acts.output_for_backward(1, 0);
  EXPECT_TRUE(again.requires_grad());
  EXPECT_TRUE(torch::equal(again, outs[1])) << "the recompute draws the forward's dropout mask";
  EXPECT_TRUE(s.acts.output_for_backward(0, 0).is_same(outs[0])) << "a kept unit's output is the forward's";
  s.acts.after_bwd(1);
  EXPECT_FALSE(s.acts.input(1).defined());
}

// checkpoint_offload: a checkpointed unit's input leaves the device after its forward (only the host copy
// is kept) and comes back, equal and requiring its gradient, for the recompute.
TEST(ActivationsPiece, CheckpointOffloadKeepsTheInputOnTheHostUntilTheRecompute) {
  Rig rig([](Plan& p) {
    p.checkpointing = {Checkpointing::Mode::units, {1, 2}};
    p.checkpoint_offload = true;
  });
  PlainStep s(rig);
  torch::Tensor target;
  const std::vector<torch::Tensor> outs = s.forward(0, &target);
  EXPECT_TRUE(s.acts.input(0).defined()) << "unit 0 is not checkpointed";
  EXPECT_FALSE(s.acts.input(1).defined());
  EXPECT_FALSE(s.acts.input(2).defined());
  const torch::Tensor out = s.acts.output_for_backward(2, 0);
  ASSERT_TRUE(s.acts.input(2).defined());
  EXPECT_TRUE(s.acts.input(2).requires_grad());
  EXPECT_TRUE(torch::equal(s.acts.input(2), outs[1]));
  EXPECT_TRUE(torch::equal(out, outs[2]));
  s.acts.after_bwd(2);
  EXPECT_FALSE(s.acts.input(2).defined());
}

std::vector<torch::Tensor> unit_buffers(const pieces::Ctx& c) {
  std::vector<torch::Tensor> out;
  for (const auto& U : c.units)
    for (const auto& b : U.module->buffers()) out.push_back(b.clone());
  return out;
}

bool same_tensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

// A recompute updates BatchNorm's running statistics a second time; once the unit's backward ran they are
// as the forward left them (torch.utils.checkpoint's contract for buffers).
TEST(ActivationsPiece, RecomputeLeavesBatchNormStatisticsAsTheForwardLeftThem) {
  Rig rig([](Plan& p) { p.checkpointing = {Checkpointing::Mode::all, {}}; }, "resnet", "resnet-tiny");
  PlainStep s(rig);
  torch::Tensor target;
  s.forward(0, &target);
  const std::vector<torch::Tensor> after_forward = unit_buffers(*rig.c);
  ASSERT_FALSE(after_forward.empty());
  bool changed = false;
  for (int u = rig.c->unit_count() - 1; u >= 0; --u) {
    s.acts.output_for_backward(u, 0);
    changed = changed || !same_tensors(unit_buffers(*rig.c), after_forward);
    s.acts.after_bwd(u);
  }
  EXPECT_TRUE(changed) << "the recompute ran BatchNorm in training mode";
  EXPECT_TRUE(same_tensors(unit_buffers(*rig.c), after_forward));
}

// Activation offload sends the policy's share of what autograd saves to the host (ratio 1: every saved
// tensor of every unit; 0.5: part of them) and brings it back for the backward: the gradients are the
// same bits as without offload.
TEST(ActivationOffloadPiece, OffloadsItsShareAndTheGradientsAreUnchanged) {
  Rig plain([](Plan&) {});
  PlainStep reference(plain);
  reference.microbatch(0, true, 0.125);
  for (const double ratio : {1.0, 0.5}) {
    Rig rig([&](Plan& p) { p.offload.activations_ratio = ratio; });
    PlainStep s(rig);
    s.microbatch(0, true, 0.125);
    std::int64_t bytes = 0, offloaded = 0;
    for (const OffloadedActivations& a : s.acts.offload().summary()) {
      bytes += a.bytes;
      offloaded += a.offloaded_bytes;
      if (ratio == 1.0) {
        EXPECT_EQ(a.offloaded, a.tensors) << a.name;
        EXPECT_EQ(a.offloaded_bytes, a.bytes) << a.name;
      }
    }
    EXPECT_GT(offloaded, 0) << "ratio " << ratio;
    if (ratio < 1) {
      EXPECT_LT(offloaded, bytes);
    }
    EXPECT_TRUE(torch::equal(s.grads.full(), reference.grads.full())) << "ratio " << ratio;
  }
}

// One tensor at a time, the device never holds a unit's whole saved share: with everything offloaded,
// resnet50 (224 x 224, batch 8, one process) peaks below the same step with every unit checkpointed,
// which holds only the units' inputs and, in a unit's backward, that unit's recomputed activations.
// (When a unit's share came back whole before its backward, and the unit before it was prefetched, ratio
// 1 peaked at 872.6 MiB, above checkpointing's 744 MiB; one tensor at a time it is 561 MiB.)
TEST(ActivationOffloadPiece, RatioOnePeaksBelowCheckpointingEveryUnit) {
  auto peak = [](const std::function<void(Plan&)>& set) {
    RunOptions o;
    o.model = "resnet";
    o.preset = "resnet50";
    o.steps = 1;
    o.warmup_steps = 0;
    o.threads = 1;
    o.plan = Plan::default_ddp(1, 8);
    set(o.plan);
    LocalCommunicator comm;
    return run_rank(o, comm).device_peak_bytes;
  };
  const std::int64_t offloaded = peak([](Plan& p) { p.offload.activations_ratio = 1; });
  const std::int64_t checkpointed = peak([](Plan& p) { p.checkpointing.mode = Checkpointing::Mode::all; });
  std::printf("resnet50 batch 8 device peak: ratio 1 %lld B, checkpointing every unit %lld B\n",
              static_cast<long long>(offloaded), static_cast<long long>(checkpointed));
  EXPECT_LT(offloaded, checkpointed) << "ratio 1 " << offloaded << " B, checkpointing every unit " << checkpointed << " B";
}

// differentiate: the gradient of the unit's input, its own parameters' gradients in its region at their
// slots, and a tied weight's gradient in its owner's region (the GPT head's use of the token embedding),
// as autograd computes them; the regions of other units are not asked for. Alike whether autograd adds
// them in place or returns them, and in place no parameter is left holding its region as .grad.
TEST(AutogradStepPiece, DifferentiateSendsTiedWeightGradientsToTheirOwner) {
  Rig rig([](Plan&) {});
  pieces::Ctx& c = *rig.c;
  pieces::ParamResidency params(c);
  const int head = c.unit_count() - 1;
  const pieces::UnitRT& U = c.unit(head);
  ASSERT_FALSE(U.borrows.empty()) << "gpt2-tiny's head uses the token embedding";
  torch::Tensor h;
  {
    torch::NoGradGuard no_grad;
    h = pieces::model_input(c, c.model.task->batch(0, 0, 2).input);
    for (int u = 0; u < head; ++u) h = c.unit(u).module->forward(h);
  }
  std::vector<torch::Tensor> wrt{h.detach().requires_grad_(true)};
  for (const auto& s : U.flat.slots()) wrt.push_back(s.param);
  for (const auto& b : U.borrows) wrt.push_back(b.param);
  const torch::Tensor grad = torch::randn_like(U.module->forward(wrt[0]));
  const std::vector<torch::Tensor> want = torch::autograd::grad({U.module->forward(wrt[0])}, wrt, {grad});

  for (const bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "returned");
    std::map<int, torch::Tensor> regions;
    auto region = [&](int u) {
      torch::Tensor& r = regions[u];
      if (!r.defined()) r = torch::zeros({c.unit(u).numel()});
      return r;
    };
    const torch::Tensor in = h.detach().requires_grad_(true);
    const torch::Tensor got_in =
        pieces::differentiate(c, head, U.module->forward(in), in, grad, region, nullptr, in_place);
    EXPECT_TRUE(torch::allclose(got_in, want[0]));
    EXPECT_FALSE(in.grad().defined());
    std::size_t i = 1;
    for (const auto& s : U.flat.slots()) {
      EXPECT_TRUE(torch::allclose(regions[head].narrow(0, s.offset, s.numel), want[i++].reshape({-1})));
      EXPECT_FALSE(s.param.grad().defined()) << s.name;
    }
    for (const auto& b : U.borrows) {
      ASSERT_TRUE(regions.count(b.owner));
      EXPECT_TRUE(torch::allclose(regions[b.owner].narrow(0, b.offset, b.numel), want[i++].reshape({-1})));
      EXPECT_FALSE(b.param.grad().defined());
    }
    EXPECT_EQ(regions.size(), 1 + U.borrows.size()) << "only the unit's own region and its owners'";
  }
}

// In place, a unit's backward holds one parameter's gradient at a time beside its region: a GPT block's
// backward peaks lower than when autograd returns every gradient to be added after, by at least half the
// gradients it no longer holds at once (all but the largest).
TEST(AutogradStepPiece, InPlaceBackwardHoldsNoSecondCopyOfTheGradients) {
  Rig rig([](Plan&) {});
  pieces::Ctx& c = *rig.c;
  pieces::ParamResidency params(c);
  const int block = 1;
  const pieces::UnitRT& U = c.unit(block);
  ASSERT_TRUE(U.borrows.empty());
  torch::Tensor h;
  {
    torch::NoGradGuard no_grad;
    h = pieces::model_input(c, c.model.task->batch(0, 0, 2).input);
    for (int u = 0; u < block; ++u) h = c.unit(u).module->forward(h);
  }
  std::int64_t grads = 0, largest = 0;
  for (const auto& s : U.flat.slots()) {
    grads += s.numel * 4;
    largest = std::max<std::int64_t>(largest, s.numel * 4);
  }
  auto backward_peak = [&](bool in_place) {
    torch::Tensor region = torch::zeros({U.numel()});
    const torch::Tensor in = h.detach().requires_grad_(true);
    torch::Tensor out = U.module->forward(in);
    const torch::Tensor grad = torch::ones_like(out);
    ScopedCpuAllocator counting;
    const std::int64_t before = counting.allocator().reset_peak();
    torch::Tensor got = pieces::differentiate(c, block, std::move(out), in, grad, [&](int) { return region; },
                                              nullptr, in_place);
    return counting.allocator().peak_bytes() - before;
  };
  const std::int64_t returned = backward_peak(false), in_place = backward_peak(true);
  std::printf("block backward peak: returned %lld B, in place %lld B, gradients %lld B (largest %lld B)\n",
              static_cast<long long>(returned), static_cast<long long>(in_place), static_cast<long long>(grads),
              static_cast<long long>(largest));
  EXPECT_LE(in_place, returned - (grads - largest) / 2);
}

// loss_grad: the loss summed into loss_sum, its gradient scaled by `scale` (the loss scale over the ranks
// and microbatches), in the logits' dtype.
TEST(AutogradStepPiece, LossGradientIsScaledAndTheLossSummed) {
  Rig rig([](Plan&) {});
  pieces::Ctx& c = *rig.c;
  const zoo::Batch b = c.model.task->batch(0, 0, 2);
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = pieces::model_input(c, b.input);
    for (int u = 0; u < c.unit_count(); ++u) logits = c.unit(u).module->forward(logits);
  }
  double loss_sum = 0;
  const torch::Tensor g1 = pieces::loss_grad(c, logits, b.target, 0, 1.0, loss_sum);
  const double one = loss_sum;
  const torch::Tensor g8 = pieces::loss_grad(c, logits.to(torch::kBFloat16), b.target, 0, 8.0, loss_sum);
  EXPECT_GT(one, 0);
  EXPECT_NEAR(loss_sum, 2 * one, 0.02 * one);
  EXPECT_EQ(g8.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(g8.to(torch::kFloat32), 8 * g1, 0.02, 1e-6));
}

// AdaScale: the squared norm of each microbatch's gradient (a tied weight's of the sum of its owner's and
// borrower's parts), undone of the loss scale, and one all-reduce of two fp64 numbers; the gain is
// AdaScaleGain's of those sums.
TEST(AdaScalePiece, GainFromEachMicrobatchsNormAndOneSmallAllReduce) {
  Rig rig([](Plan& p) {
    p.optimizer.name = "sgd";
    p.adascale = true;
    p.microbatches = 2;
  });
  PlainStep s(rig);
  pieces::AdaScale adascale(*rig.c);
  adascale.begin_step();
  const double scale = 1.0 / (4 * 2);  // the executor's: ranks x microbatches
  s.microbatch(0, false, scale, &adascale);
  const torch::Tensor g0 = s.grads.full().to(torch::kFloat64);
  s.microbatch(1, true, scale, &adascale);
  s.grads.finish_step();
  const torch::Tensor full = s.grads.full().to(torch::kFloat64);  // 4 identical ranks: 4 (g0 + g1)
  const torch::Tensor g1 = full / 4 - g0;
  rig.comm.reset();
  const double gain = adascale.finish(s.grads);
  int count = 0;
  EXPECT_EQ(total(rig.calls(), Collective::kAllReduce, &count), 16);
  EXPECT_EQ(count, 1);
  const double S = 8;  // samples: 4 ranks x 2 microbatches
  AdaScaleGain expect(S);
  const double sum_sqr = 4 * S * S * (g0.dot(g0).item<double>() + g1.dot(g1).item<double>());
  const double want = expect.update(sum_sqr, full.dot(full).item<double>());
  EXPECT_GT(gain, 1.0);
  EXPECT_LE(gain, S);
  EXPECT_NEAR(gain, want, 1e-3 * want);
}

// Precision with dynamic loss scaling: the gradients unscaled in place, one all-reduce of the overflow
// flag (on the world's communicator where a pipeline sets one), every rank skipping when a peer saw an
// overflow and the scale backing off; check() leaves the scale on the gradients for the master's step.
TEST(PrecisionPiece, UnscalesChecksWithThePeersAndBacksOffOnAPeersOverflow) {
  Rig rig([](Plan& p) {
    p.precision.param_dtype = p.precision.compute_dtype = "fp16";
    p.precision.loss_scale.mode = LossScale::Mode::dynamic;
  });
  pieces::Precision precision(*rig.c);
  const double scale = precision.loss_scale();
  ASSERT_GT(scale, 1.0);
  torch::Tensor g = torch::full({8}, 2 * scale);
  EXPECT_FALSE(precision.unscale_and_check({g}));
  EXPECT_TRUE(torch::allclose(g, torch::full({8}, 2.0)));
  int count = 0;
  total(rig.calls(), Collective::kAllReduce, &count);
  EXPECT_EQ(count, 1);

  torch::Tensor kept = torch::full({8}, 2 * scale);
  EXPECT_FALSE(precision.check({kept}));
  EXPECT_TRUE(torch::allclose(kept, torch::full({8}, 2 * scale))) << "check() leaves the scale on";
  EXPECT_NEAR((kept[0] * precision.unscale_factor()).item<double>(), 2.0, 1e-6);

  piece_rig::MirrorCommunicator world_mirror(1, 8);
  CountingCommunicator world(world_mirror);
  rig.c->world_comm = &world;
  world_mirror.peer_adds = 1;  // a peer saw an inf
  rig.comm.reset();
  torch::Tensor finite = torch::full({8}, scale);
  EXPECT_TRUE(precision.unscale_and_check({finite})) << "a peer's overflow skips this rank's step too";
  EXPECT_TRUE(rig.calls().empty()) << "the world's communicator decides, not the stage's";
  total(world.calls(), Collective::kAllReduce, &count);
  EXPECT_EQ(count, 1);
  precision.after_step(true);
  EXPECT_EQ(precision.loss_scale(), scale / 2);
}

// Without loss scaling (fp32, bf16) the piece touches nothing and asks no one.
TEST(PrecisionPiece, WithoutLossScalingNothingIsCheckedOrScaled) {
  Rig rig([](Plan& p) { p.precision.param_dtype = p.precision.compute_dtype = "bf16"; });
  pieces::Precision precision(*rig.c);
  EXPECT_EQ(precision.loss_scale(), 1.0);
  torch::Tensor g = torch::full({8}, std::numeric_limits<float>::infinity());
  EXPECT_FALSE(precision.unscale_and_check({g}));
  EXPECT_FALSE(precision.unscale_factor().defined());
  EXPECT_TRUE(rig.calls().empty());
}

// OffloadModel (2 slices): the same gradients and loss as the plain step over the same microbatches, no
// collective before the last microbatch (no_sync), then each slice's gradients all-reduced once.
TEST(OffloadModelPiece, SlicesGiveThePlainStepsGradientsReducedOnTheLastMicrobatch) {
  Rig plain([](Plan& p) { p.microbatches = 2; });
  PlainStep reference(plain);
  const double scale = 1.0 / 8;
  double want_loss = reference.microbatch(0, false, scale);
  want_loss += reference.microbatch(1, true, scale);
  reference.grads.finish_step();

  Rig rig([](Plan& p) {
    p.microbatches = 2;
    p.offload_model = {true, 2, false, 1};
  });
  pieces::ParamResidency params(*rig.c);
  pieces::GradSync grads(*rig.c);
  grads.set_all_reduce_comm(&rig.comm);
  grads.zero();
  pieces::OffloadModel om(*rig.c, params, grads, nullptr);
  double loss = 0;
  om.microbatch(0, 0, scale, loss);
  EXPECT_TRUE(rig.calls().empty()) << "no_sync before the last microbatch";
  om.microbatch(0, 1, scale, loss);
  grads.finish_step();
  int count = 0;
  const std::int64_t bytes = total(rig.calls(), Collective::kAllReduce, &count);
  EXPECT_GE(count, 2) << "each slice reduces its own units";
  EXPECT_EQ(bytes, rig.c->padded_total * 4);
  EXPECT_NEAR(loss, want_loss, 1e-6 * want_loss);
  EXPECT_TRUE(torch::allclose(grads.full(), reference.grads.full(), 1e-5, 1e-7));
}

}  // namespace
}  // namespace zeroplan::exec
