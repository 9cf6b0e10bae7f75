// The timing rounds: whole training steps' compute as the executor runs it, with the run's other local
// ranks computing beside the measured one, and how far ranks drift apart over a step.
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <barrier>
#include <mutex>
#include <string>
#include <thread>

#include "internal.h"
#include "zeroplan/profiles/errors.h"

namespace zeroplan::detail {

// The executor's backward of one unit (pieces::differentiate in exec/src/step): the gradients of the
// input (when it needs one) and of `params`, each parameter's added into `accum`. The executor has
// autograd add them in place (the same adds, inside the backward); here autograd returns them, because
// the concurrent ranks' threads share the parameters, whose .grad the in-place path would set.
// Returns the input's gradient (undefined when the input needs none).
torch::Tensor accumulate_backward(const torch::Tensor& y, const torch::Tensor& g, const torch::Tensor& x,
                                  const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& accum) {
  std::vector<torch::Tensor> inputs;
  const bool input_grad = x.requires_grad();
  if (input_grad) inputs.push_back(x);
  inputs.insert(inputs.end(), params.begin(), params.end());
  const auto grads = torch::autograd::grad({y}, inputs, {g}, /*retain_graph=*/false, /*create_graph=*/false,
                                           /*allow_unused=*/true);
  torch::NoGradGuard no_grad;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const torch::Tensor& gk = grads[k + (input_grad ? 1 : 0)];
    if (gk.defined()) accum[k].add_(gk.reshape(accum[k].sizes()));
  }
  return input_grad ? grads[0] : torch::Tensor();
}

// A thread that stands for a rank: `threads` intra-op threads (0: torch's default).
void init_rank_thread(int threads) {
  if (threads > 0) {
    at::set_num_threads(threads);
  } else {
    at::init_num_threads();
  }
}

// One zeroed gradient accumulation buffer per parameter (the executor's flat gradient, per tensor).
std::vector<torch::Tensor> zeroed_like(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(torch::zeros_like(p));
  return out;
}

// One training step's compute at one batch, as the executor runs it: the forward of every unit in order
// on the previous unit's detached output (the last with the loss and its gradient), then the backward of
// every unit in reverse from its output's gradient, each parameter's gradient added into `accum`. A
// unit's backward so finds its activations as a step leaves them (the rest of the model ran in between,
// the caches hold something else), and the units run in the order the run interleaves them with a
// concurrent rank's. With `fwd` and `bwd` (one entry per unit), each phase is timed into them (and
// traced with dev.trace), and `loss_s` gets the loss's part of the last unit's forward; without,
// nothing is timed (a concurrent rank's step).
void step_pass(std::vector<zoo::Unit>& units, const torch::Tensor& input, const LossFn& loss,
               const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& accum, Devices* dev, int batch,
               int repeat, double* fwd, double* bwd, double* loss_s) {
  const std::size_t nu = units.size();
  ProfilerTrace* trace = dev != nullptr ? dev->trace : nullptr;
  double ts_us = 0;
  std::int64_t live0 = 0;
  auto begin = [&] {
    if (dev == nullptr) return;
    if (trace != nullptr) {
      live0 = dev->memory.begin_phase();
      ts_us = trace->begin_us();
    }
    dev->timer.start();
  };
  auto end = [&](double* out, std::size_t i, const char* phase, double earlier_s = 0) {
    if (dev == nullptr) return;
    out[i] = dev->timer.stop_s() + earlier_s;
    if (trace != nullptr) {
      const TracedPhase traced{units[i].name, static_cast<int>(i), batch, repeat};
      trace->phase(ProfilerTrace::kTimedTid, std::string(phase) + " " + units[i].name, ts_us, out[i],
                   traced.args(phase), live0, dev->memory.live(), dev->memory.peak());
    }
  };
  std::vector<torch::Tensor> xs(nu), ys(nu);
  torch::Tensor x = input, g;
  for (std::size_t i = 0; i < nu; ++i) {
    xs[i] = x.detach();
    // The model's input never needs a gradient (the executor differentiates only later units' inputs).
    if (xs[i].is_floating_point() && i > 0) xs[i].requires_grad_(true);
    begin();
    ys[i] = units[i].module->forward(xs[i]);
    double earlier_s = 0;  // the last unit: its own forward and its loss, timed apart and summed
    if (i + 1 == nu && loss && ys[i].requires_grad()) {
      if (dev != nullptr) {
        earlier_s = dev->timer.stop_s();
        dev->timer.start();
      }
      torch::Tensor z = ys[i].detach().requires_grad_(true);
      g = torch::autograd::grad({loss(z)}, {z})[0];
      if (dev != nullptr) {
        const double l = dev->timer.stop_s();
        if (loss_s != nullptr) *loss_s = l;
        earlier_s += l;
        dev->timer.start();
      }
    }
    end(fwd, i, "forward", earlier_s);
    x = ys[i];
  }
  x = torch::Tensor();
  for (std::size_t k = nu; k-- > 0;) {
    if (!g.defined()) g = torch::ones_like(ys[k]);
    begin();
    torch::Tensor g_in;
    if (ys[k].requires_grad()) g_in = accumulate_backward(ys[k], g, xs[k], params, accum);
    end(bwd, k, "backward");
    ys[k] = torch::Tensor();
    xs[k] = torch::Tensor();
    g = g_in;
  }
}

// How far `ranks` ranks drift apart over one training step's compute started together: `rounds` times,
// every rank (the calling thread and ranks - 1 others, `threads` intra-op threads each) waits at a
// barrier, then runs step_pass; each round gives (slowest - mean) / mean of their durations. Returns
// the mean over the rounds: the fraction of a step by which the last rank to reach a collective trails.
double lock_step_skew(std::vector<zoo::Unit>& units, const torch::Tensor& input, const LossFn& loss,
                      const std::vector<torch::Tensor>& params, int ranks, int threads, int rounds) {
  std::vector<std::vector<double>> seconds(static_cast<std::size_t>(ranks), std::vector<double>(rounds, 0.0));
  std::barrier sync(ranks);
  std::mutex error_mutex;
  std::string error;
  auto rank = [&](int r) {
    std::vector<torch::Tensor> accum = zeroed_like(params);
    for (int k = 0; k < rounds; ++k) {
      sync.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      try {
        step_pass(units, input, loss, params, accum, nullptr, 0, 0, nullptr, nullptr);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error.empty()) error = e.what();
      }
      seconds[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };
  {
    std::vector<std::thread> others;
    for (int r = 1; r < ranks; ++r) {
      others.emplace_back([&, r] {
        init_rank_thread(threads);
        rank(r);
      });
    }
    rank(0);
    for (auto& t : others) t.join();
  }
  if (!error.empty()) throw SchemaError("profile: a concurrent rank's thread failed: " + error.substr(0, error.find('\n')));
  // The first round pays for the threads' first allocations: left out.
  double sum = 0;
  int used = 0;
  for (int k = 1; k < rounds; ++k) {
    double mx = 0, mean = 0;
    for (int r = 0; r < ranks; ++r) {
      const double s = seconds[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
      mx = std::max(mx, s);
      mean += s / ranks;
    }
    if (mean > 0) {
      sum += (mx - mean) / mean;
      ++used;
    }
  }
  return used > 0 ? std::min(1.0, sum / used) : 0.0;
}

}  // namespace zeroplan::detail
