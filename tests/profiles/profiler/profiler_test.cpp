#include "zeroplan/profiles/profiler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>

#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/flops.h"
#include "zeroplan/profiles/saved_tensors.h"
#include "zeroplan/profiles/timer.h"
#include "zeroplan/profiles/trace.h"
#include "zeroplan/profiles/zoo.h"
#include <zeroplan/config.h>

namespace zeroplan {
namespace {

// A unit that is one Linear layer (with bias).
class LinearUnit : public zoo::UnitModule {
 public:
  LinearUnit(int64_t in, int64_t out) : lin_(register_module("lin", torch::nn::Linear(in, out))) {}
  torch::Tensor forward(const torch::Tensor& x) override { return lin_->forward(x); }

 private:
  torch::nn::Linear lin_;
};

// Four bias-free Linear layers of width w: four weights, each made by its own node of the backward.
class LinearStackUnit : public zoo::UnitModule {
 public:
  explicit LinearStackUnit(int64_t w) {
    for (int i = 0; i < 4; ++i)
      layers_.push_back(register_module("lin" + std::to_string(i), torch::nn::Linear(torch::nn::LinearOptions(w, w).bias(false))));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor y = x;
    for (auto& l : layers_) y = l->forward(y);
    return y;
  }

 private:
  std::vector<torch::nn::Linear> layers_;
};

ProfileOptions quick() {
  ProfileOptions o;
  o.warmup = 1;
  o.repeats = 3;
  return o;
}

// What print_profile_table writes for `p`.
std::string table_text(const ModelProfile& p) {
  std::FILE* f = std::tmpfile();
  print_profile_table(p, f);
  std::rewind(f);
  std::string text(1 << 16, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  return text;
}

TEST(Profiler, LinearSavedActivationsEqualClosedForm) {
  // addmm(bias, x, W^T) saves x (for grad W) and W^T (for grad x); W is a parameter, not an
  // activation, so the saved activation is the input alone: batch * in * 4 bytes.
  const int64_t batch = 16, in = 256, out = 128;
  LinearUnit unit(in, out);
  torch::Tensor x = torch::randn({batch, in});
  UnitMeasurement m = profile_unit(unit, x, quick());
  const double closed_form = static_cast<double>(batch * in * 4);
  EXPECT_NEAR(m.bytes_saved, closed_form, 0.01 * closed_form);
  EXPECT_EQ(m.bytes_output, static_cast<double>(batch * out * 4));
  EXPECT_EQ(m.params, in * out + out);
  EXPECT_EQ(m.bytes_param, (in * out + out) * 4);
  EXPECT_EQ(m.input_shape, (std::vector<int64_t>{batch, in}));
  EXPECT_EQ(m.output_shape, (std::vector<int64_t>{batch, out}));
  EXPECT_GE(m.bytes_peak_fwd, m.bytes_output);
  // Backward allocates at least grad W, grad b and grad x.
  EXPECT_GE(m.bytes_peak_bwd, static_cast<double>((in * out + out + batch * in) * 4));
  EXPECT_EQ(m.flops_fwd, flops::linear(batch, in, out));
  EXPECT_EQ(m.flops_bwd, 2 * flops::linear(batch, in, out));
  EXPECT_GT(m.time_fwd_s, 0);
  EXPECT_GT(m.time_bwd_s, 0);
  EXPECT_GE(m.time_fwd_spread_s, 0);
}

TEST(Profiler, LinearOn3dInputSavesItsInput) {
  const int64_t b = 4, s = 8, in = 32, out = 64;
  LinearUnit unit(in, out);
  UnitMeasurement m = profile_unit(unit, torch::randn({b, s, in}), quick());
  EXPECT_NEAR(m.bytes_saved, static_cast<double>(b * s * in * 4), 0.01 * b * s * in * 4);
  // ATen may run a 3-D linear as matmul + add_: the bias add is then counted (b*s*out, elementwise).
  EXPECT_NEAR(m.flops_fwd, flops::linear(b * s, in, out), 0.02 * flops::linear(b * s, in, out));
}

TEST(Profiler, UnitThatSavesNothingOfItsInputStillHoldsIt) {
  // y = x * 2 + 1: autograd saves nothing, but a training step holds every unit's input until the
  // unit's backward (the executor differentiates against it), so the input is what the unit keeps.
  struct Affine : zoo::UnitModule {
    torch::Tensor forward(const torch::Tensor& x) override { return x * 2 + 1; }
  } unit;
  UnitMeasurement m = profile_unit(unit, torch::randn({64, 64}), quick());
  EXPECT_EQ(m.bytes_saved, 64 * 64 * 4);
  EXPECT_EQ(m.bytes_output, 64 * 64 * 4);
}

TEST(Profiler, SavedTensorsAreWhatTheUnitAloneKeeps) {
  // Linear -> tanh -> Linear: autograd saves x (the input: kept anyway), tanh's output h (saved by
  // tanh's backward and by the second Linear: one storage) and the weights (parameters). The unit alone
  // keeps h: one tensor of batch x hidden x 4 bytes.
  struct TwoLayer : zoo::UnitModule {
    TwoLayer() : a(register_module("a", torch::nn::Linear(32, 48))), b(register_module("b", torch::nn::Linear(48, 16))) {}
    torch::Tensor forward(const torch::Tensor& x) override { return b->forward(torch::tanh(a->forward(x))); }
    torch::nn::Linear a, b;
  } unit;
  UnitMeasurement m = profile_unit(unit, torch::randn({8, 32}), quick());
  EXPECT_EQ(m.saved_tensors, (std::vector<std::int64_t>{8 * 48 * 4}));
  // What the unit keeps is its input plus these.
  EXPECT_NEAR(m.bytes_saved, 8 * 32 * 4 + 8 * 48 * 4, 64);
}

TEST(SavedTensorHooks, EveryTensorAutogradSavesPassesThroughThemAndGradientsAreUnchanged) {
  torch::manual_seed(3);
  torch::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  torch::Tensor x = torch::randn({4, 16});
  auto loss_of = [&] { return torch::relu(torch::mm(x, w)).pow(2).sum(); };
  torch::Tensor plain = torch::autograd::grad({loss_of()}, {w})[0];
  saved_tensors::Recorder rec;
  torch::Tensor y;
  {
    saved_tensors::Scope scope(rec);
    y = loss_of();
  }
  // mm saves x and w; relu its output; pow its input (relu's output again).
  EXPECT_GE(rec.saved().size(), 3u);
  const auto own = saved_tensors::distinct_storages(rec.saved(), {x, w}, torch::kCPU);
  ASSERT_EQ(own.size(), 1u);  // relu's output, saved twice, one storage
  EXPECT_EQ(rec.saved()[own[0]].bytes, 4 * 16 * 4);
  torch::Tensor hooked = torch::autograd::grad({y}, {w})[0];
  EXPECT_TRUE(torch::equal(plain, hooked));
  // Outside the scope nothing is recorded.
  const std::size_t n = rec.saved().size();
  (void)loss_of();
  EXPECT_EQ(rec.saved().size(), n);
}

// With the gradients accumulated in place (bytes_peak_bwd_in_place) the backward holds one weight's
// gradient at a time; made fresh (bytes_peak_bwd) it ends holding all four.
TEST(Profiler, InPlaceBackwardPeakHoldsOneWeightGradientAtATime) {
  const int64_t w = 256, batch = 8;
  LinearStackUnit unit(w);
  UnitMeasurement m = profile_unit(unit, torch::randn({batch, w}), quick());
  const double weight = static_cast<double>(w * w * 4), act = static_cast<double>(batch * w * 4);
  EXPECT_GE(m.bytes_peak_bwd, 4 * weight - act);  // the output's gradient is freed on the way
  EXPECT_GE(m.bytes_peak_bwd_in_place, weight);
  EXPECT_LE(m.bytes_peak_bwd_in_place, weight + 4 * act) << "made fresh: " << m.bytes_peak_bwd;
  // The timeline: the three later layers' inputs (the first's is the unit's input), unpacked last saved
  // first, and the backward's peak among the segments.
  EXPECT_EQ(m.saved_tensors, (std::vector<std::int64_t>(3, batch * w * 4)));
  EXPECT_EQ(m.bwd_unpack_order, (std::vector<std::int64_t>{2, 1, 0}));
  ASSERT_EQ(m.bwd_unpack_peaks.size(), 4u);
  ASSERT_EQ(m.bwd_unpack_peaks_in_place.size(), 4u);
  EXPECT_EQ(*std::max_element(m.bwd_unpack_peaks.begin(), m.bwd_unpack_peaks.end()), m.bytes_peak_bwd);
  EXPECT_EQ(*std::max_element(m.bwd_unpack_peaks_in_place.begin(), m.bwd_unpack_peaks_in_place.end()),
            m.bytes_peak_bwd_in_place);
}

TEST(Profiler, SameUnitTwiceGivesIdenticalMemoryFigures) {
  LinearUnit unit(128, 96);
  torch::Tensor x = torch::randn({8, 128});
  UnitMeasurement a = profile_unit(unit, x, quick());
  UnitMeasurement b = profile_unit(unit, x, quick());
  EXPECT_EQ(a.bytes_saved, b.bytes_saved);
  EXPECT_EQ(a.bytes_output, b.bytes_output);
  EXPECT_EQ(a.bytes_peak_fwd, b.bytes_peak_fwd);
  EXPECT_EQ(a.bytes_peak_bwd, b.bytes_peak_bwd);
  EXPECT_EQ(a.bytes_peak_bwd_in_place, b.bytes_peak_bwd_in_place);
  EXPECT_EQ(a.flops_fwd, b.flops_fwd);
}

TEST(Flops, ClosedFormsPerOp) {
  torch::NoGradGuard no_grad;
  {
    flops::FlopCounter c;
    auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1).stride(2));
    torch::Tensor y = conv->forward(torch::randn({2, 8, 16, 16}));
    ASSERT_EQ(y.sizes(), (torch::IntArrayRef{2, 16, 8, 8}));
    EXPECT_EQ(c.count().matmul, flops::conv2d(2, 8, 16, 3, 3, 8, 8));
    EXPECT_EQ(c.count().elementwise, 0);
  }
  {
    flops::FlopCounter c;
    auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1).groups(4));
    conv->forward(torch::randn({1, 8, 10, 10}));
    EXPECT_EQ(c.count().matmul, flops::conv2d(1, 8, 16, 3, 3, 10, 10, 4));
  }
  {
    flops::FlopCounter c;
    const int64_t b = 2, heads = 4, s = 16, d = 8;
    torch::Tensor q = torch::randn({b, heads, s, d});
    torch::scaled_dot_product_attention(q, q, q);
    EXPECT_EQ(c.count().matmul, flops::attention(b, s, s, heads * d));
  }
  {
    flops::FlopCounter c;
    torch::matmul(torch::randn({3, 5, 7}), torch::randn({7, 2}));
    EXPECT_EQ(c.count().matmul, 2.0 * 3 * 5 * 7 * 2);
  }
  {
    flops::FlopCounter c;
    torch::Tensor x = torch::randn({4, 10});
    torch::layer_norm(x, {10});
    torch::softmax(x, -1);
    torch::gelu(x);
    EXPECT_EQ(c.count().elementwise,
              40 * (flops::kLayerNormPerElement + flops::kSoftmaxPerElement + flops::kGeluPerElement));
    EXPECT_EQ(c.count().matmul, 0);
  }
}

TEST(Fit, ExactLineAndNoise) {
  Fit f = fit_linear({2, 4, 8}, {10 + 3 * 2, 10 + 3 * 4, 10 + 3 * 8});
  EXPECT_DOUBLE_EQ(f.intercept, 10);
  EXPECT_DOUBLE_EQ(f.per_sample, 3);
  EXPECT_DOUBLE_EQ(f.r2, 1);
  EXPECT_EQ(f.points, 3);
  Fit c = fit_linear({2, 4}, {5, 5});
  EXPECT_DOUBLE_EQ(c.per_sample, 0);
  EXPECT_DOUBLE_EQ(c.r2, 1);
  Fit n = fit_linear({1, 2, 3, 4}, {1, 3, 2, 4});
  EXPECT_LT(n.r2, 1);
  EXPECT_GT(n.r2, 0);
  Fit one = fit_linear({4}, {8});
  EXPECT_DOUBLE_EQ(one.at(2), 4);
}

TEST(Timing, MedianAndSpread) {
  TimingStats s = timing_stats({5, 1, 3, 2, 4});
  EXPECT_DOUBLE_EQ(s.median_s, 3);
  EXPECT_DOUBLE_EQ(s.p10_s, 1.4);
  EXPECT_DOUBLE_EQ(s.p90_s, 4.6);
  EXPECT_NEAR(s.spread_s(), 3.2, 1e-12);
  FakeTimer t({0.5, 1.5});
  t.start();
  EXPECT_EQ(t.stop_s(), 0.5);
  EXPECT_EQ(t.stop_s(), 1.5);
}

TEST(Profiler, MlpModelProfileIsValidAndFitted) {
  zoo::Model model = zoo::build_model("mlp", "", {{"depth", "3"}, {"width", "64"}}, 1);
  ProfileOptions o = quick();
  o.batch = 4;
  o.batches = {2, 4, 8};
  o.threads = 1;
  ModelProfile p = profile_model(model, o);
  EXPECT_NO_THROW(validate(p));
  EXPECT_EQ(p.total_params(), model.parameter_count());
  EXPECT_EQ(p.units.size(), model.units.size());
  EXPECT_EQ(p.threads, 1);
  EXPECT_EQ(p.device, "cpu");
  EXPECT_EQ(p.dtype, "fp32");
  EXPECT_EQ(p.library_versions.at("torch"), TORCH_VERSION);
  EXPECT_EQ(p.profiled_batches, (std::vector<int>{2, 4, 8}));
  EXPECT_EQ(p.input_shape, (std::vector<int64_t>{4, 32}));
  for (const UnitProfile& u : p.units) {
    EXPECT_EQ(u.bytes_saved.fit.points, 3) << u.name;
    // Activations and FLOPs are exactly linear in batch with no intercept.
    EXPECT_NEAR(u.bytes_output.fit.intercept, 0, 1e-6) << u.name;
    EXPECT_NEAR(u.bytes_output.fit.r2, 1, 1e-12) << u.name;
    EXPECT_NEAR(u.bytes_saved.fit.at(16), 4 * u.bytes_saved.value, 1e-6 * u.bytes_saved.value + 1e-9);
    EXPECT_NEAR(u.flops_fwd.fit.r2, 1, 1e-12) << u.name;
    EXPECT_GT(u.flops_fwd.value, 0) << u.name;
    EXPECT_EQ(u.input_shape[0], 4);
  }
  // The first unit's saved input is the model input: 4 x 32 floats.
  EXPECT_NEAR(p.units[0].bytes_saved.value, 4 * 32 * 4, 0.01 * 4 * 32 * 4);
  // Round trip through JSON.
  nlohmann::json j = p;
  EXPECT_EQ(j.get<ModelProfile>(), p);

  const std::string text = table_text(p);
  EXPECT_NE(text.find("module name"), std::string::npos);
  EXPECT_NE(text.find("total:"), std::string::npos);
  EXPECT_NE(text.find(p.units[0].name), std::string::npos);
}

// A unit whose time falls as the batch grows (here: it sleeps 12 - batch ms) is flagged in the profile's
// notes, printed with the table, and kept through JSON.
TEST(Profiler, TimeFallingWithTheBatchIsFlagged) {
  struct Slower : zoo::UnitModule {
    explicit Slower(std::shared_ptr<zoo::UnitModule> inner) : inner_(register_module("inner", std::move(inner))) {}
    torch::Tensor forward(const torch::Tensor& x) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(12 - x.size(0)));
      return inner_->forward(x);
    }
    std::shared_ptr<zoo::UnitModule> inner_;
  };
  zoo::Model model = zoo::build_model("mlp", "", {{"depth", "2"}, {"width", "16"}}, 1);
  model.units[0].module = std::make_shared<Slower>(model.units[0].module);
  ProfileOptions o = quick();
  o.batch = 2;
  o.batches = {2, 8};
  o.threads = 1;
  ModelProfile p = profile_model(model, o);
  ASSERT_FALSE(p.notes.empty());
  EXPECT_NE(p.notes[0].find("unit " + p.units[0].name + ": forward time falls with the batch"), std::string::npos)
      << p.notes[0];
  nlohmann::json j = p;
  EXPECT_EQ(j.get<ModelProfile>().notes, p.notes);
  const std::string text = table_text(p);
  EXPECT_NE(text.find("note: unit " + p.units[0].name), std::string::npos) << text;
}

// Convolutions, BatchNorm and pooling under the counting allocator: every unit of resnet-tiny is
// measured, its memory is the same in a second profile, and the saved bytes grow with the batch.
TEST(Profiler, ResnetTinyProfilesUnderTheCountingAllocator) {
  zoo::Model model = zoo::build_model("resnet", "resnet-tiny", {}, 1);
  ProfileOptions o = quick();
  o.batch = 2;
  o.batches = {2, 4};
  o.threads = 1;
  ModelProfile p = profile_model(model, o);
  EXPECT_NO_THROW(validate(p));
  ASSERT_EQ(p.units.size(), 6u);
  EXPECT_EQ(p.total_params(), model.parameter_count());
  EXPECT_EQ(p.image_size, 64);
  for (const UnitProfile& u : p.units) {
    EXPECT_GT(u.bytes_saved.value, 0) << u.name;
    EXPECT_GT(u.bytes_peak_bwd.value, 0) << u.name;
    EXPECT_GT(u.bytes_peak_bwd_in_place.value, 0) << u.name;
    EXPECT_LE(u.bytes_peak_bwd_in_place.value, u.bytes_peak_bwd.value) << u.name;
    EXPECT_GT(u.flops_fwd.value, 0) << u.name;
    EXPECT_GT(u.bytes_saved.fit.at(4), u.bytes_saved.value) << u.name;
  }
  // The stem's output: 2 x 8 x 16 x 16 floats.
  EXPECT_EQ(p.units[0].bytes_output.value, 2 * 8 * 16 * 16 * 4);
  ModelProfile again = profile_model(model, o);
  for (std::size_t i = 0; i < p.units.size(); ++i) {
    EXPECT_EQ(p.units[i].bytes_saved.value, again.units[i].bytes_saved.value) << p.units[i].name;
    EXPECT_EQ(p.units[i].bytes_peak_bwd.value, again.units[i].bytes_peak_bwd.value) << p.units[i].name;
  }
}

TEST(Profiler, Gpt2TinyBlocksCountTransformerFlops) {
  zoo::Model model = zoo::build_model("gpt", "gpt2-tiny", {}, 1);
  ProfileOptions o = quick();
  o.batch = 2;
  o.batches = {1, 2};
  o.repeats = 1;
  ModelProfile p = profile_model(model, o);
  EXPECT_NO_THROW(validate(p));
  EXPECT_EQ(p.total_params(), model.parameter_count());
  EXPECT_GT(p.seq_len, 0);
  print_profile_table(p, stdout);
  const double b = 2, s = static_cast<double>(p.seq_len);
  for (const UnitProfile& u : p.units) {
    if (u.type != "TransformerBlock") continue;
    const double h = static_cast<double>(u.output_shape.back());
    const double matmul = 24 * b * s * h * h + 4 * b * s * s * h;
    EXPECT_GE(u.flops_fwd.value, matmul) << u.name;
    EXPECT_LE(u.flops_fwd.value, 1.3 * matmul) << u.name;  // plus elementwise estimates
    EXPECT_GT(u.bytes_saved.value, 0) << u.name;
  }
}

// At a 16-bit dtype the last unit's loss runs in fp32 on a copy of its logits, as the executor computes
// it (autocast's rule for losses): its forward peak holds the 16-bit logits, their fp32 copy, the fp32
// log-softmax and its fp32 gradient (7 x the 16-bit output here), where a 16-bit loss holds about 4 x.
TEST(Profiler, SixteenBitLossRunsInFp32) {
  for (const std::string dtype : {"bf16", "fp16"}) {
    zoo::Model model =
        zoo::build_model("gpt", "", {{"layers", "1"}, {"hidden", "32"}, {"heads", "2"}, {"seq", "16"}, {"vocab", "2048"}}, 1);
    ProfileOptions o = quick();
    o.batch = 2;
    o.batches = {1, 2};
    o.repeats = 1;
    o.dtype = dtype;
    ModelProfile p = profile_model(model, o);
    const UnitProfile& head = p.units.back();
    EXPECT_DOUBLE_EQ(head.bytes_output.value, 2.0 * 2 * 16 * 2048) << dtype;
    EXPECT_GE(head.bytes_peak_fwd.value, 6 * head.bytes_output.value) << dtype;
  }
}

TEST(Profiler, ModelProfiledTwiceGivesIdenticalMemoryFigures) {
  zoo::Model model = zoo::build_model("gpt", "gpt2-tiny", {}, 3);
  ProfileOptions o = quick();
  o.batch = 1;
  o.batches = {1};
  o.repeats = 1;
  ModelProfile a = profile_model(model, o);
  ModelProfile b = profile_model(model, o);
  ASSERT_EQ(a.units.size(), b.units.size());
  for (std::size_t i = 0; i < a.units.size(); ++i) {
    EXPECT_EQ(a.units[i].bytes_saved, b.units[i].bytes_saved) << a.units[i].name;
    EXPECT_EQ(a.units[i].bytes_output, b.units[i].bytes_output) << a.units[i].name;
    EXPECT_EQ(a.units[i].bytes_peak_fwd, b.units[i].bytes_peak_fwd) << a.units[i].name;
    EXPECT_EQ(a.units[i].bytes_peak_bwd, b.units[i].bytes_peak_bwd) << a.units[i].name;
    EXPECT_EQ(a.units[i].flops_fwd, b.units[i].flops_fwd) << a.units[i].name;
  }
}

// Under the run's conditions: each unit timed while another thread (a second local rank) computes the
// same unit, and the backward adding every gradient into a buffer as the executor does. The memory pass
// runs alone: the same memory figures as a profile taken alone; the run conditions are recorded.
TEST(Profiler, ConcurrentRanksLeaveMemoryAndRecordTheConditions) {
  zoo::Model model = zoo::build_model("gpt", "gpt2-tiny", {}, 3);
  ProfileOptions o = quick();
  o.batch = 1;
  o.batches = {1};
  o.repeats = 2;
  o.threads = 1;
  ModelProfile alone = profile_model(model, o);
  EXPECT_EQ(alone.concurrent_ranks, 1);
  EXPECT_TRUE(alone.backward_adds_grads);
  o.concurrent_ranks = 2;
  ModelProfile both = profile_model(model, o);
  EXPECT_EQ(both.concurrent_ranks, 2);
  EXPECT_TRUE(both.backward_adds_grads);
  EXPECT_EQ(both.threads, 1);
  ASSERT_EQ(alone.units.size(), both.units.size());
  for (std::size_t i = 0; i < both.units.size(); ++i) {
    EXPECT_EQ(alone.units[i].bytes_saved, both.units[i].bytes_saved) << both.units[i].name;
    EXPECT_EQ(alone.units[i].bytes_peak_fwd, both.units[i].bytes_peak_fwd) << both.units[i].name;
    EXPECT_EQ(alone.units[i].bytes_peak_bwd, both.units[i].bytes_peak_bwd) << both.units[i].name;
    EXPECT_GT(both.units[i].time_fwd_s.value, 0) << both.units[i].name;
    EXPECT_GT(both.units[i].time_bwd_s.value, 0) << both.units[i].name;
  }
  validate(both);
  o.concurrent_ranks = 0;
  EXPECT_THROW(profile_model(model, o), SchemaError);
}

// Timing rounds visit every (batch, unit) pair once, each round one pair later, odd rounds backwards.
TEST(Profiler, RoundOrderRotatesAndAlternates) {
  EXPECT_EQ(round_order(4, 0), (std::vector<std::size_t>{0, 1, 2, 3}));
  EXPECT_EQ(round_order(4, 1), (std::vector<std::size_t>{0, 3, 2, 1}));
  EXPECT_EQ(round_order(4, 2), (std::vector<std::size_t>{2, 3, 0, 1}));
  EXPECT_EQ(round_order(4, 3), (std::vector<std::size_t>{2, 1, 0, 3}));
  EXPECT_EQ(round_order(4, 4), round_order(4, 0));
  EXPECT_TRUE(round_order(0, 3).empty());
}

TEST(Profiler, BadOptionsNameTheValue) {
  zoo::Model model = zoo::build_model("mlp", "", {{"depth", "2"}, {"width", "8"}}, 1);
  ProfileOptions o = quick();
  o.dtype = "fp8";
  try {
    profile_model(model, o);
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos);
  }
  o = quick();
  o.repeats = 0;
  EXPECT_THROW(profile_model(model, o), SchemaError);
}

// The profile's trace: per unit, batch and round a forward and a backward span on tid 0 carrying the
// durations the medians came from, the memory pass on tid 1, and "memory device" counters at each
// span's start and end; spans on a track do not overlap.
TEST(Profiler, TraceHasPerUnitSpansAndMemoryCounters) {
  zoo::Model model = zoo::build_model("mlp", "", {{"depth", "2"}, {"width", "16"}}, 1);
  ProfileOptions o = quick();
  o.repeats = 2;  // fewer than 3 samples are never re-measured, so the span count is exact
  o.batch = 2;
  o.batches = {2, 4};
  o.threads = 1;
  TraceWriter trace;
  ModelProfile p = profile_model(model, o, &trace);
  const nlohmann::json events = nlohmann::json::parse(trace.json()).at("traceEvents");
  const std::size_t nu = p.units.size();
  std::map<int, std::vector<nlohmann::json>> spans_by_tid;
  std::vector<nlohmann::json> counters;
  std::map<std::string, std::string> threads;
  for (const auto& e : events) {
    EXPECT_EQ(e.at("pid"), 0);
    if (e.at("ph") == "X") spans_by_tid[e.at("tid").get<int>()].push_back(e);
    if (e.at("ph") == "C") counters.push_back(e);
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      threads[std::to_string(e.at("tid").get<int>())] = e.at("args").at("name");
  }
  EXPECT_EQ(threads, (std::map<std::string, std::string>{{"0", "compute"}, {"1", "memory pass"}}));
  ASSERT_EQ(spans_by_tid[0].size(), nu * 2 * 2 * 2);  // units x batches x repeats x (fwd, bwd)
  ASSERT_EQ(spans_by_tid[1].size(), nu * 2 * 2);      // units x batches x (fwd, bwd)
  EXPECT_EQ(counters.size(), 2 * (spans_by_tid[0].size() + spans_by_tid[1].size()));
  for (const auto& c : counters) {
    EXPECT_EQ(c.at("name"), "memory device");
    EXPECT_GE(c.at("args").at("bytes").get<std::int64_t>(), 0);
    EXPECT_GE(c.at("args").at("peak_bytes").get<std::int64_t>(), c.at("args").at("bytes").get<std::int64_t>());
  }
  for (const auto& [tid, spans] : spans_by_tid) {
    for (std::size_t k = 1; k < spans.size(); ++k) {
      EXPECT_LE(spans[k - 1].at("ts").get<double>() + spans[k - 1].at("dur").get<double>(),
                spans[k].at("ts").get<double>() + 0.002)
          << "tid " << tid << " span " << k;
    }
  }
  // Each unit's median at the reference batch is the median (here: the mean) of its two timed spans.
  for (std::size_t i = 0; i < nu; ++i) {
    for (const char* phase : {"forward", "backward"}) {
      std::vector<double> durs;
      for (const auto& e : spans_by_tid[0]) {
        const auto& a = e.at("args");
        if (a.at("unit") == static_cast<int>(i) && a.at("batch") == 2 && a.at("phase") == phase) {
          EXPECT_EQ(e.at("name"), std::string(phase) + " " + p.units[i].name);
          EXPECT_EQ(a.at("unit_name"), p.units[i].name);
          durs.push_back(e.at("dur").get<double>());
        }
      }
      ASSERT_EQ(durs.size(), 2u) << p.units[i].name << " " << phase;
      const Figure& f = std::string(phase) == "forward" ? p.units[i].time_fwd_s : p.units[i].time_bwd_s;
      EXPECT_NEAR((durs[0] + durs[1]) / 2, f.value * 1e6, 0.002) << p.units[i].name << " " << phase;
    }
  }
  // The memory pass comes first: its first span is unit 0's forward at batch 2, and its counters'
  // peak above what was live before it is the profile's bytes_peak_fwd.
  const auto& first_fwd = spans_by_tid[1][0];
  EXPECT_EQ(first_fwd.at("name"), "forward " + p.units[0].name);
  EXPECT_EQ(first_fwd.at("args").at("batch"), 2);
  EXPECT_FALSE(first_fwd.at("args").contains("repeat"));
  EXPECT_DOUBLE_EQ(first_fwd.at("ts").get<double>(), counters[0].at("ts").get<double>());
  EXPECT_EQ(counters[1].at("args").at("peak_bytes").get<std::int64_t>() - counters[0].at("args").at("bytes").get<std::int64_t>(),
            static_cast<std::int64_t>(p.units[0].bytes_peak_fwd.value));
  // No CUPTI on the CPU: no kernel times in the profile.
  for (const UnitProfile& u : p.units) EXPECT_EQ(u.kernel_time_fwd_s, Figure{}) << u.name;
}

// With CUPTI the summed kernel times of each unit are saved in the profile and its JSON.
TEST(Profiler, KernelTimesSaved_CUDA) {
  if (!ZEROPLAN_HAVE_CUPTI || !torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device or no CUPTI";
  zoo::Model model = zoo::build_model("mlp", "", {{"depth", "2"}, {"width", "256"}}, 1);
  ProfileOptions o = quick();
  o.device = "cuda";
  o.batch = 16;
  ModelProfile p = profile_model(model, o);
  const nlohmann::json j = p;
  for (std::size_t i = 0; i < p.units.size(); ++i) {
    EXPECT_GT(p.units[i].kernel_time_fwd_s.value, 0) << p.units[i].name;
    EXPECT_GT(p.units[i].kernel_time_bwd_s.value, 0) << p.units[i].name;
    EXPECT_TRUE(j["units"][i].contains("kernel_time_fwd_s")) << p.units[i].name;
  }
  EXPECT_EQ(j.get<ModelProfile>(), p);
}

TEST(Profiler, LinearUnit_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  LinearUnit unit(256, 128);
  unit.to(torch::kCUDA);
  torch::Tensor x = torch::randn({16, 256}, torch::kCUDA);
  UnitMeasurement m = profile_unit(unit, x, quick());
  EXPECT_NEAR(m.bytes_saved, 16 * 256 * 4, 0.01 * 16 * 256 * 4);
  EXPECT_GT(m.time_fwd_s, 0);
}

}  // namespace
}  // namespace zeroplan
