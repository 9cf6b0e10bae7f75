#include "cpu_times.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace zeroplan::exec {

CpuTimes read_cpu_times(bool with_children) {
  CpuTimes t;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (!(tick > 0)) return t;
  std::ifstream stat("/proc/stat");
  std::string line;
  while (std::getline(stat, line)) {
    if (line.rfind("cpu ", 0) == 0) {
      std::istringstream in(line.substr(4));
      double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
      if (in >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal)
        t.machine_busy_s = (user + nice + system + irq + softirq + steal) / tick;
    } else if (line.rfind("cpu", 0) == 0) {
      ++t.cores;
    }
  }
  std::ifstream self("/proc/self/stat");
  std::string all((std::istreambuf_iterator<char>(self)), std::istreambuf_iterator<char>());
  // Fields after the command name (in parentheses, which may hold spaces): state is field 3, utime 14,
  // stime 15.
  if (const auto close = all.rfind(')'); close != std::string::npos) {
    std::istringstream in(all.substr(close + 1));
    std::string field;
    double own = 0;
    const int last = with_children ? 17 : 15;  // cutime and cstime follow: children waited for
    for (int k = 3; k <= last && in >> field; ++k) {
      if (k >= 14) own += std::atof(field.c_str());
    }
    if (in) t.own_s = own / tick;
  }
  return t;
}

double other_load_cores(const CpuTimes& from, const CpuTimes& to, double others_own_cores) {
  const double wall = std::chrono::duration<double>(to.at - from.at).count();
  if (!(wall > 0) || from.machine_busy_s < 0 || to.machine_busy_s < 0 || from.own_s < 0 || to.own_s < 0) return -1;
  const double busy = (to.machine_busy_s - from.machine_busy_s) / wall;
  const double own = (to.own_s - from.own_s) / wall;
  return std::max(0.0, busy - own - others_own_cores);
}

}  // namespace zeroplan::exec
