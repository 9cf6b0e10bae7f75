// fairscale OffloadModel: its schedule (as the simulator's, sim/src/lowering/offload_model.cpp) and its
// parameter and gradient residency. Slices come from offload_model_slice_starts, the simulator's
// function; a slice's units and the owners of the weights they borrow are on the device while it runs.
// Parameters come from the host's flat buffer and are only read on the device, so dropping them copies
// nothing back; gradients go home after the slice's backward.
#include <utility>

#include "pieces.h"
#include "zeroplan/profiles/pipeline.h"

namespace zeroplan::exec::pieces {

OffloadModel::OffloadModel(Ctx& c, ParamResidency& params, GradSync& grads, AdaScale* adascale)
    : c_(c), params_(params), grads_(grads), adascale_(adascale) {
  std::vector<std::int64_t> numel;
  for (const UnitRT& U : c.units) numel.push_back(U.numel());
  starts_ = offload_model_slice_starts(numel, c.plan.offload_model.slices);
  std::vector<std::vector<int>> owners;
  for (const UnitRT& U : c.units) {
    owners.emplace_back();
    for (const Borrow& b : U.borrows) owners.back().push_back(b.owner);
  }
  members_ = offload_model_slice_members(starts_, owners);
  loaded_.assign(c.units.size(), 0);
  grad_.resize(c.units.size());
}

void OffloadModel::load_params(int u, int micro) {
  UnitRT& U = c_.unit(u);
  const auto i = static_cast<std::size_t>(u);
  if (loaded_[i] || U.numel() == 0) return;
  c_.at(U.name, "h2d params");
  realloc_storage(U.full);
  const double t0 = c_.rec.now_s();
  c_.dev.copy_h2d(U.full, params_.flat().narrow(0, U.base, U.layout.padded_numel()));
  c_.dev.wait_copies();
  c_.rec.span(Lane::h2d, "h2d params " + U.name, t0, c_.rec.now_s(), "h2d", u, micro);
  loaded_[i] = 1;
}

void OffloadModel::drop_params(int u) {
  UnitRT& U = c_.unit(u);
  const auto i = static_cast<std::size_t>(u);
  if (!loaded_[i]) return;
  free_storage(U.full);
  loaded_[i] = 0;
}

void OffloadModel::load_forward(int s, int micro) {
  torch::NoGradGuard no_grad;
  for (int u : members(s)) load_params(u, micro);
}

void OffloadModel::drop_forward(int s) {
  for (int u : members(s)) drop_params(u);
}

void OffloadModel::load_backward(int s, int micro) {
  torch::NoGradGuard no_grad;
  micro_ = micro;
  for (int u : members(s)) {
    load_params(u, micro);
    if (c_.unit(u).numel() > 0) region(u);
  }
}

torch::Tensor OffloadModel::region(int u) {
  torch::Tensor& g = grad_[static_cast<std::size_t>(u)];
  if (g.defined()) return g;
  const UnitRT& U = c_.unit(u);
  if (micro_ == 0) {
    g = c_.dzeros(U.layout.padded_numel(), c_.dt.grad);
    return g;
  }
  // Later microbatches: the gradient accumulated so far comes back with the slice.
  torch::NoGradGuard no_grad;
  g = c_.dempty(U.layout.padded_numel(), c_.dt.grad);
  const double t0 = c_.rec.now_s();
  c_.dev.copy_h2d(g, grads_.full().narrow(0, U.base, U.layout.padded_numel()));
  c_.dev.wait_copies();
  c_.rec.span(Lane::h2d, "h2d grads " + U.name, t0, c_.rec.now_s(), "h2d", u, micro_);
  return g;
}

void OffloadModel::finish_backward(int s, int micro, bool last_micro) {
  torch::NoGradGuard no_grad;
  for (int u = first(s); u < end(s); ++u) {
    torch::Tensor& g = grad_[static_cast<std::size_t>(u)];
    UnitRT& U = c_.unit(u);
    if (U.numel() == 0) continue;
    if (!g.defined()) region(u);  // a unit whose backward wrote nothing still sends its gradient home
    if (last_micro && c_.world > 1) {
      c_.at(U.name, "all_reduce");
      const double t = c_.rec.now_s();
      torch::Tensor wire = c_.dt.all_reduce == c_.dt.grad ? g : g.to(c_.dt.all_reduce);
      auto h = c_.tracker.issue(c_.comm.all_reduce(wire, ReduceOp::kSum), t, "all_reduce " + U.name, "all_reduce", u, micro);
      c_.tracker.wait(h);
      if (!wire.is_same(g)) g.copy_(wire);
    }
    c_.at(U.name, "d2h grads");
    const double t0 = c_.rec.now_s();
    c_.dev.copy_d2h(grads_.full().narrow(0, U.base, U.layout.padded_numel()), g);
    c_.dev.wait_copies();
    c_.rec.span(Lane::d2h, "d2h grads " + U.name, t0, c_.rec.now_s(), "d2h", u, micro);
    g = torch::Tensor();
  }
  for (int u : members(s)) drop_params(u);
}

// One unit's forward (or recompute) inside the schedule: the input a leaf when grad mode is on (unless it
// is the model's input), kept in *in_leaf when given; the output with its graph, or none under no_grad.
torch::Tensor OffloadModel::unit_forward(int u, const torch::Tensor& x, int micro, bool recompute, torch::Tensor* in_leaf) {
  Ctx& c = c_;
  const char* phase = recompute ? "recompute" : "forward";
  c.at(c.unit(u).name, phase);
  torch::Tensor in = (u > 0 && x.is_floating_point() && torch::GradMode::is_enabled()) ? x.detach().requires_grad_(true) : x;
  const double t0 = c.rec.now_s();
  torch::Tensor out;
  {
    ComputeScope compute(c.dt, c.dev.torch_device().type());
    out = c.unit(u).module->forward(in);
  }
  c.dev.wait_compute();
  c.rec.span(Lane::compute, std::string(phase) + " " + c.unit(u).name, t0, c.rec.now_s(), phase, u, micro);
  if (in_leaf != nullptr) *in_leaf = in;
  return out;
}

// The micro batch in K chunks; forward slice by slice, each slice loaded once and run over every chunk
// (checkpoint_activation: under no_grad, the slice's output for each chunk sent to the host, the model's
// input too); the loss per chunk after the last slice; backward slice by slice in reverse, each loaded
// with its gradients and run over every chunk (checkpoint_activation: the chunk's slice input back from
// the host and the slice recomputed first), then its gradients home.
void OffloadModel::microbatch(std::int64_t step, int j, double scale, double& loss_sum) {
  Ctx& c = c_;
  Device& dev = c.dev;
  const int K = c.plan.offload_model.microbatches;
  const bool ckpt = c.plan.offload_model.checkpoint_activation;
  const int m = c.plan.microbatches, n_units = c.unit_count(), S = slices();
  const std::int64_t chunk = c.plan.micro_batch / K;
  auto micro = [&](int k) { return j * K + k; };
  std::vector<torch::Tensor> x(static_cast<std::size_t>(K)), target(static_cast<std::size_t>(K)),
      grad(static_cast<std::size_t>(K));
  // checkpoint_activation: per slice and chunk, the slice's input on the host and the RNG state.
  std::vector<torch::Tensor> boundary(static_cast<std::size_t>(S * K));
  std::vector<Recompute> recompute(static_cast<std::size_t>(S * K));
  auto at = [&](int s, int k) { return static_cast<std::size_t>(s * K + k); };
  // Without checkpoint_activation: per unit and chunk, its input leaf and its output with the graph.
  std::vector<torch::Tensor> ins(static_cast<std::size_t>(n_units * K)), outs(static_cast<std::size_t>(n_units * K));
  auto ui = [&](int u, int k) { return static_cast<std::size_t>(u * K + k); };
  auto to_host = [&](const torch::Tensor& t, int u, int k) {
    torch::Tensor h = dev.host_pool().empty(t.numel(), t.scalar_type());
    const double t0 = c.rec.now_s();
    dev.copy_d2h(h, t.detach().reshape({-1}));
    dev.wait_copies();
    c.rec.span(Lane::d2h, "d2h activations " + c.unit(u).name, t0, c.rec.now_s(), "d2h", u, micro(k));
    return std::make_pair(h, t.sizes().vec());
  };
  std::vector<std::vector<std::int64_t>> shapes(static_cast<std::size_t>(S * K));
  auto to_device = [&](int s, int k) {
    const torch::Tensor& h = boundary[at(s, k)];
    torch::Tensor d = torch::empty(shapes[at(s, k)], h.options().device(dev.torch_device()));
    const double t0 = c.rec.now_s();
    dev.copy_h2d(d.view({-1}), h);
    dev.wait_copies();
    c.rec.span(Lane::h2d, "h2d activations " + c.unit(first(s)).name, t0, c.rec.now_s(), "h2d", first(s), micro(k));
    return d;
  };

  c.at("all", "data");
  for (int k = 0; k < K; ++k) {
    zoo::Batch batch = c.model.task->batch(step, (static_cast<std::int64_t>(c.rank) * m + j) * c.plan.micro_batch + k * chunk, chunk);
    x[static_cast<std::size_t>(k)] = model_input(c, std::exchange(batch.input, torch::Tensor()));
    target[static_cast<std::size_t>(k)] = std::exchange(batch.target, torch::Tensor()).to(dev.torch_device());
    if (ckpt) {
      auto [h, shape] = to_host(x[static_cast<std::size_t>(k)], 0, k);
      boundary[at(0, k)] = h;
      shapes[at(0, k)] = shape;
      x[static_cast<std::size_t>(k)] = torch::Tensor();
    }
  }
  for (int s = 0; s < S; ++s) {
    load_forward(s, j);
    for (int k = 0; k < K; ++k) {
      torch::Tensor cur = ckpt ? to_device(s, k) : std::exchange(x[static_cast<std::size_t>(k)], torch::Tensor());
      if (ckpt) recompute[at(s, k)].save_rng(dev);
      {
        torch::NoGradGuard no_grad;
        torch::AutoGradMode mode(!ckpt);
        for (int u = first(s); u < end(s); ++u) {
          torch::Tensor out = unit_forward(u, cur, micro(k), false, ckpt ? nullptr : &ins[ui(u, k)]);
          if (!ckpt) outs[ui(u, k)] = out;
          cur = out.detach();
        }
      }
      if (s + 1 < S) {
        if (ckpt) {
          auto [h, shape] = to_host(cur, end(s) - 1, k);
          boundary[at(s + 1, k)] = h;
          shapes[at(s + 1, k)] = shape;
        } else {
          x[static_cast<std::size_t>(k)] = std::move(cur);
        }
      } else {
        grad[static_cast<std::size_t>(k)] =
            loss_grad(c, std::move(cur), target[static_cast<std::size_t>(k)], micro(k), scale, loss_sum);
        target[static_cast<std::size_t>(k)] = torch::Tensor();
      }
      cur = torch::Tensor();
    }
    drop_forward(s);
  }
  for (int s = S - 1; s >= 0; --s) {
    load_backward(s, j);
    for (int k = 0; k < K; ++k) {
      if (ckpt) {  // the slice's input back and the slice's forward again, with its graph
        torch::Tensor cur = to_device(s, k);
        boundary[at(s, k)] = torch::Tensor();
        // The slice's buffers kept: the recompute updates BatchNorm-style statistics a second time, and
        // they are put back after the slice's backward of this chunk (as Activations and pipelines do).
        std::vector<std::shared_ptr<zoo::UnitModule>> modules;
        for (int u = first(s); u < end(s); ++u) modules.push_back(c.unit(u).module);
        Recompute::Replay replay(recompute[at(s, k)], dev, modules);
        for (int u = first(s); u < end(s); ++u) {
          torch::Tensor out = unit_forward(u, cur, micro(k), true, &ins[ui(u, k)]);
          outs[ui(u, k)] = out;
          cur = out.detach();
        }
      }
      torch::Tensor g = std::exchange(grad[static_cast<std::size_t>(k)], torch::Tensor());
      for (int u = end(s) - 1; u >= first(s); --u) {
        c.at(c.unit(u).name, "backward");
        const double t0 = c.rec.now_s();
        torch::Tensor in = std::exchange(ins[ui(u, k)], torch::Tensor());
        g = differentiate(c, u, std::exchange(outs[ui(u, k)], torch::Tensor()), in, g,
                          [this](int owner) { return region(owner); }, adascale_,
                          /*in_place=*/false);
        in = torch::Tensor();
        dev.wait_compute();
        c.rec.span(Lane::compute, "backward " + c.unit(u).name, t0, c.rec.now_s(), "backward", u, micro(k));
      }
      grad[static_cast<std::size_t>(k)] = std::move(g);
      if (ckpt) recompute[at(s, k)].restore_buffers();  // the statistics as the forward left them
    }
    finish_backward(s, j, j == m - 1);
  }
}

}  // namespace zeroplan::exec::pieces
