// The fake world the executor's pieces are tested in, LevelDB's Env style (pieces_test.cpp,
// pieces_compute_test.cpp, pieces_stage_test.cpp): a piece driven by hand on one rank of a world of
// identical peers (MirrorCommunicator: every peer holds what this rank holds), its collectives counted
// (CountingCommunicator); point to point between several such ranks driven on one thread through a
// Mailbox. What each piece decides (which collective, of what size, when; what stays resident; what
// reaches the gradient) is tested without ranks; the whole step's arithmetic against real ranks is
// gloo_parity_test.cpp's.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "../../../exec/src/step/pieces.h"
#include "zeroplan/exec/counting_communicator.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/recorder.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::exec::piece_rig {

struct Done final : Work {
  void wait() override {}
};

// Sends between ranks driven on one thread: a send queues a copy for (source, destination, tag), the
// matching recv takes the oldest. A recv with nothing queued is a schedule error of the test (CommError).
struct Mailbox {
  std::map<std::tuple<int, int, int>, std::deque<torch::Tensor>> queued;
  std::size_t pending() const {
    std::size_t n = 0;
    for (const auto& [key, q] : queued) n += q.size();
    return n;
  }
};

// Rank `rank` of `world` ranks that all hold the same tensors: an all-gather repeats this rank's input, a
// sum multiplies by the world, a reduce-scatter keeps this rank's chunk (times the world for a sum).
// peer_adds: what the peers add to every sum besides their copy (a peer that saw an overflow: 1).
class MirrorCommunicator final : public Communicator {
 public:
  MirrorCommunicator(int rank, int world, Mailbox* mail = nullptr) : rank_(rank), world_(world), mail_(mail) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "mirror"; }
  std::unique_ptr<Work> all_reduce(torch::Tensor& t, ReduceOp op) override {
    if (op == ReduceOp::kSum) t.mul_(world_).add_(peer_adds);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Work> all_gather(torch::Tensor& out, const torch::Tensor& in) override {
    for (int r = 0; r < world_; ++r) out.narrow(0, r * in.numel(), in.numel()).copy_(in);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Work> reduce_scatter(torch::Tensor& out, const torch::Tensor& in, ReduceOp op) override {
    out.copy_(in.narrow(0, rank_ * out.numel(), out.numel()));
    if (op == ReduceOp::kSum) out.mul_(world_);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Work> broadcast(torch::Tensor&, int) override { return std::make_unique<Done>(); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int group_size) override {
    return std::make_unique<MirrorCommunicator>(rank_ % group_size, group_size);
  }
  std::unique_ptr<Communicator> duplicate() override { return std::make_unique<MirrorCommunicator>(rank_, world_); }
  std::unique_ptr<Work> send(const torch::Tensor& t, int dst, int tag) override {
    if (mail_ == nullptr) return Communicator::send(t, dst, tag);
    mail_->queued[{rank_, dst, tag}].push_back(t.detach().clone());
    return std::make_unique<Done>();
  }
  std::unique_ptr<Work> recv(torch::Tensor& t, int src, int tag) override {
    if (mail_ == nullptr) return Communicator::recv(t, src, tag);
    auto& q = mail_->queued[{src, rank_, tag}];
    if (q.empty()) throw CommError("mirror: rank " + std::to_string(rank_) + " receives tag " + std::to_string(tag) +
                                   " from rank " + std::to_string(src) + " before it was sent");
    t.copy_(q.front());
    q.pop_front();
    return std::make_unique<Done>();
  }
  std::vector<std::string> fallbacks() const override { return {}; }
  double peer_adds = 0;

 private:
  int rank_, world_;
  Mailbox* mail_;
};

// A built-in model on rank `rank` of a fake world of `world` ranks, its plan set by `setup` (world_size,
// global_batch world x 2 x microbatches and micro_batch 2 are set before it runs).
struct Rig {
  Rig(const std::function<void(Plan&)>& setup, const std::string& model_name = "gpt",
      const std::string& preset = "gpt2-tiny", const zoo::Options& options = {}, int rank = 1, int world = 4,
      int ranks_per_node = 0)
      : model(zoo::build_model(model_name, preset, options, 0)), mirror(rank, world), comm(mirror), dev(make_device("cpu")),
        rec(rank, false) {
    plan.world_size = world;
    plan.micro_batch = 2;
    setup(plan);
    plan.global_batch = world * plan.micro_batch * plan.microbatches;
    c = std::make_unique<pieces::Ctx>(model, plan, comm, *dev, rec, ranks_per_node);
  }
  // gpt2-tiny (4 units: embed, 2 blocks, head) on rank 1 of a fake world of 4, at `stage`.
  explicit Rig(int stage, bool reshard = true, bool prefetch = true, std::int64_t bucket = -1, int localsgd = 0)
      : Rig(
            [&](Plan& p) {
              p.zero_stage = stage;
              p.reshard_after_forward = stage == 3 && reshard;
              p.buckets.prefetch = prefetch;
              if (bucket > 0) {
                p.buckets.reduce_buffer_elems = bucket;
                p.buckets.all_reduce_bucket_bytes = bucket * 4;
              }
              p.localsgd_frequency = localsgd;
            },
            "gpt", "gpt2-tiny", {}, 1, 4, localsgd > 0 ? 1 : 0) {}  // LocalSGD: every rank a node of its own
  std::vector<CollectiveCall> calls() const { return comm.calls(); }
  zoo::Model model;
  Plan plan;
  MirrorCommunicator mirror;
  CountingCommunicator comm;
  std::unique_ptr<Device> dev;
  Recorder rec;
  std::unique_ptr<pieces::Ctx> c;
};

// The collectives of `kind` among `calls`: their bytes, and their number in *count.
inline std::int64_t total(const std::vector<CollectiveCall>& calls, Collective kind, int* count) {
  std::int64_t bytes = 0;
  *count = 0;
  for (const auto& call : calls)
    if (call.kind == kind) {
      bytes += call.bytes;
      ++*count;
    }
  return bytes;
}

}  // namespace zeroplan::exec::piece_rig
