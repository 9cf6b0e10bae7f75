// A store belongs to one job: the first rank to join claims it with its job id, the others must match.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "zeroplan/exec/rendezvous.h"

namespace zeroplan::exec {

void check_job(c10d::Store& store, const RankContext& ctx) {
  if (ctx.job_id.empty()) return;
  const std::vector<std::uint8_t> mine(ctx.job_id.begin(), ctx.job_id.end());
  std::vector<std::uint8_t> holder;
  try {
    holder = store.compareSet("zeroplan/job", {}, mine);
  } catch (const std::exception& e) {
    throw RendezvousError(fmt::format("rank {}: cannot claim the store at {}:{} for job {}: {}", ctx.rank,
                                      ctx.master_addr, ctx.master_port, ctx.job_id, e.what()));
  }
  const std::string theirs(holder.begin(), holder.end());
  if (theirs != ctx.job_id) {
    throw RendezvousError(fmt::format(
        "rank {} of job {} reached the store at {}:{}, which job {} holds: two jobs on one port (give each its "
        "own MASTER_PORT)",
        ctx.rank, ctx.job_id, ctx.master_addr, ctx.master_port, theirs));
  }
}

}  // namespace zeroplan::exec
