// The executor's pieces (pieces.h lists them): ParamResidency (params_residency.cpp).
#pragma once

#include "context.h"

namespace zeroplan::exec::pieces {

class ParamResidency {
 public:
  // Moves every unit's parameters into the flat storage. OffloadModel: the flat buffer is on the host and
  // each unit's device buffer (UnitRT::full) is freed; the OffloadModel piece fills it when a slice visits.
  explicit ParamResidency(Ctx& c);
  void before_fwd(int u, int micro);           // u (and the owners it borrows from) gathered; next prefetched
  void after_fwd(int u);                       // resharded after forward unless pinned
  void before_bwd(int u, int micro);
  void after_bwd(int u);                       // released after its backward

  bool sharded() const { return sharded_; }    // stage 3: parameters sharded across ranks
  bool on_host() const { return on_host_; }    // OffloadModel: flat() is on the host
  // Stages 0-2: the full flat parameters of every unit (on the host with OffloadModel). Stage 3: this
  // rank's shard (host with offload.params).
  torch::Tensor& flat() { return sharded_ ? shard_all_ : flat_all_; }
  // This rank's chunk of unit u's current parameters (a view of flat()).
  torch::Tensor chunk(int u);
  // Every parameter, full, "unit.name" (gathers and releases at stage 3: collective).
  std::vector<std::pair<std::string, torch::Tensor>> full_copy();
  bool views_valid() const;

 private:
  void gather(int u, int micro);   // start unit u's all-gather (no-op when gathered or in flight)
  void ensure(int u, int micro);   // gathered, waiting for it
  void release(int u);
  Ctx& c_;
  bool sharded_ = false;
  bool on_host_ = false;
  torch::Tensor flat_all_, shard_all_;
  std::vector<char> gathered_;
  std::vector<CommTracker::Handle> gathers_;
  std::vector<torch::Tensor> gather_src_;
};

}  // namespace zeroplan::exec::pieces
