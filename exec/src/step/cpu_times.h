// CPU time of the whole machine and of this process, from Linux's /proc (-1 elsewhere): how a run or a
// probe tells how much of the machine other programs took while it measured.
#pragma once

#include <chrono>

namespace zeroplan::exec {

struct CpuTimes {
  double machine_busy_s = -1;  // every core: user, nice, system, irq, softirq, steal
  double own_s = -1;           // this process (every thread), and its waited-for children when asked
  int cores = 0;
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
};

CpuTimes read_cpu_times(bool with_children = false);

// Cores other programs kept busy on average between `from` and `to`, given the cores this process
// (and, with `others_own_cores`, other processes of ours, e.g. the other ranks) used; -1 when unknown.
double other_load_cores(const CpuTimes& from, const CpuTimes& to, double others_own_cores = 0);

}  // namespace zeroplan::exec
