// A store belongs to one job: the first rank to join claims it with its job id, the others must match.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "zeroplan/exec/rendezvous.h"

namespace zeroplan::exec {

void check_job(c10d::Store& store, const RankContext& ctx) {
  if (ctx.job_id.empty() && ctx.secret.empty()) return;
  const std::string tag = job_tag(ctx.secret, ctx.job_id);
  const std::vector<std::uint8_t> mine(tag.begin(), tag.end());
  std::vector<std::uint8_t> holder;
  try {
    holder = store.compareSet("zeroplan/job", {}, mine);
  } catch (const std::exception& e) {
    throw RendezvousError(fmt::format("rank {}: cannot claim the store at {}:{} for job {}: {}", ctx.rank,
                                      ctx.master_addr, ctx.master_port, ctx.job_id, e.what()));
  }
  const std::string theirs(holder.begin(), holder.end());
  if (theirs != tag) {
    throw RendezvousError(fmt::format(
        "rank {} of job {} reached the store at {}:{}, which another job holds, or a rank with another "
        "ZEROPLAN_JOB_SECRET: two jobs on one port (give each its own MASTER_PORT) or secrets that differ",
        ctx.rank, ctx.job_id.empty() ? "(no id)" : ctx.job_id, ctx.master_addr, ctx.master_port));
  }
}

}  // namespace zeroplan::exec
