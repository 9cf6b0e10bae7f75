#include "report_common.h"

#include "export_common.h"
#include "zeroplan/tuner/explain.h"

namespace zeroplan::tuner::report {

std::map<std::string, std::int64_t> device_by_category(const Prediction& p) {
  std::map<std::string, std::int64_t> m;
  for (const char* c : kCategories) m[c] = 0;
  for (const ResidentItem& it : p.device.resident) m[it.category] += it.bytes;
  m["overhead"] += p.device.allocator_overhead_bytes;
  return m;
}

std::vector<std::pair<std::string, double>> resource_times(const Prediction& p) {
  std::vector<std::pair<std::string, double>> out;
  if (auto it = p.resource_busy_s.find("compute"); it != p.resource_busy_s.end()) out.emplace_back(*it);
  for (const auto& kv : p.resource_busy_s)
    if (kv.first != "compute") out.emplace_back(kv);
  return out;
}

std::string summary(const Plan& p) { return exports::plan_summary(p); }

std::vector<std::string> knobs_vs_default(const Plan& p, const TuneResult& r) {
  std::vector<std::string> out;
  const Plan& d = r.default_plan.plan;
  for (const std::string& k : differing_knobs(d, p)) out.push_back(k + " " + knob_value(p, k));
  return out;
}

}  // namespace zeroplan::tuner::report
