// Fuzzing every document type: a few hundred seeded mutations of a valid document each (delete a key,
// change a value's type, negate, scale by 1e12, 1e999, huge and zero integers, a junk key, truncation,
// deep nesting). Each must be read or refused with a SchemaError (one line), never another exception or
// a crash; whatever is accepted must write a document that reads back; an accepted plan, cluster or
// model must simulate (or be refused the same way) into a Prediction that reads back.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fixtures.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/comparison.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/prediction.h"
#include "zeroplan/profiles/run_record.h"
#include "zeroplan/sim/compare.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/simulate.h"

namespace zeroplan::sim {
namespace {

using nlohmann::json;

struct Seeds {
  ModelProfile model = testing::gpt(2, 128, 4, 64, 500);
  ClusterProfile cluster = resolve_cluster("a100-sxm-80gb");
  Plan plan;
  Prediction prediction;
  RunRecord record;
  Comparison comparison;
  Seeds() {
    plan = Plan::default_ddp(8, 32);
    plan.zero_stage = 3;
    plan.reshard_after_forward = true;
    plan.offload.optimizer = true;
    plan.microbatches = 2;
    plan.micro_batch = 2;
    prediction = simulate(model, cluster, plan);
    record.model = model.name;
    record.plan = plan;
    record.environment.ranks = 8;
    record.environment.backend = "nccl";
    record.environment.device = "cuda";
    record.step_times_s = {0.5, 0.4, 0.41};
    record.warmup_steps = 1;
    record.compute_step_statistics();
    record.losses = {6.0, 5.9, 5.8};
    for (int r = 0; r < 8; ++r) record.peaks.push_back({r, 1 << 30, 1 << 20, ""});
    comparison = compare(prediction, record);
  }
};

// Every value in the tree, as JSON pointers.
void pointers(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) pointers(it.value(), at / it.key(), out);
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) pointers(j[i], at / i, out);
  }
}

std::string mutate(const json& doc, std::mt19937& rng) {
  auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  json j = doc;
  std::vector<json::json_pointer> all;
  pointers(j, json::json_pointer(), all);
  std::vector<json::json_pointer> numbers, objects;
  for (const auto& p : all) {
    if (j.at(p).is_number()) numbers.push_back(p);
    if (j.at(p).is_object()) objects.push_back(p);
  }
  const auto p = all[1 + pick(all.size() - 1)];  // never the root
  const std::string text = doc.dump();
  switch (pick(10)) {
    case 0: {  // delete a key or an element
      const auto parent = p.parent_pointer();
      const std::string key = p.back();
      if (j.at(parent).is_object()) j.at(parent).erase(key);
      else j.at(parent).erase(static_cast<std::size_t>(std::stoul(key)));
      break;
    }
    case 1: {  // another type
      const json others[] = {"x", true, nullptr, json::array(), json::object(), 1, -0.5, ""};
      j.at(p) = others[pick(std::size(others))];
      break;
    }
    case 2:
      if (!numbers.empty()) {
        auto& v = j.at(numbers[pick(numbers.size())]);
        v = -v.get<double>();
      }
      break;
    case 3:
      if (!numbers.empty()) {
        auto& v = j.at(numbers[pick(numbers.size())]);
        v = v.get<double>() * 1e12;
      }
      break;
    case 4:
      if (!numbers.empty()) {  // 1e999: not representable, so spliced into the text
        j.at(numbers[pick(numbers.size())]) = "__ZP_INF__";
        std::string t = j.dump();
        const std::string marker = "\"__ZP_INF__\"";
        t.replace(t.find(marker), marker.size(), pick(2) ? "1e999" : "-1e999");
        return t;
      }
      break;
    case 5:
      if (!numbers.empty()) {
        const json huge[] = {2147483647, 2147483648LL, 9223372036854775807LL, -1, 0, 1e308, 4.9e-324};
        j.at(numbers[pick(numbers.size())]) = huge[pick(std::size(huge))];
      }
      break;
    case 6:
      j.at(objects[pick(objects.size())])["zz_junk"] = 1;
      break;
    case 7:  // truncation
      return text.substr(0, pick(text.size()));
    case 8: {  // deep nesting in place of a value
      std::string deep(1000, '[');
      deep += std::string(1000, ']');
      j.at(p) = "__ZP_DEEP__";
      std::string t = j.dump();
      const std::string marker = "\"__ZP_DEEP__\"";
      t.replace(t.find(marker), marker.size(), deep);
      return t;
    }
    default: {  // two mutations
      const std::string once = mutate(doc, rng);
      const json parsed = json::parse(once, nullptr, false);
      return parsed.is_discarded() || !parsed.is_object() || parsed.size() < 2 ? once : mutate(parsed, rng);
    }
  }
  return j.dump();
}

// Reads `text` as T: true when accepted. Fails the test on anything but SchemaError.
template <class T>
bool read_or_refuse(const std::string& text, T& out, const std::string& what) {
  try {
    out = parse_document<T>(text, "fuzz");
  } catch (const SchemaError& e) {
    const std::string m = e.what();
    if (what.find("unchanged") != std::string::npos) ADD_FAILURE() << what << ": " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << what << ": a message of several lines: " << m;
    EXPECT_FALSE(m.empty()) << what;
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": not a SchemaError: " << e.what() << "\n  document: " << text.substr(0, 2000);
    return false;
  }
  // Accepted: what it writes reads back.
  try {
    T again = parse_document<T>(to_json_string(out), "round trip");
    (void)again;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": accepted, but its own output is refused: " << e.what() << "\n  document: " << text.substr(0, 2000);
  }
  return true;
}

void simulate_reads_back(const ModelProfile& m, const ClusterProfile& c, const Plan& p, const std::string& what) {
  try {
    const Prediction pred = simulate(m, c, p);
    parse_document<Prediction>(to_json_string(pred), "prediction");
    // Never a silently wrong answer: no negative or non-finite figure.
    EXPECT_TRUE(std::isfinite(pred.step_time_s) && pred.step_time_s > 0) << what << ": step " << pred.step_time_s;
    for (const auto* pool : {&pred.device, &pred.host}) {
      EXPECT_GE(pool->peak_bytes, 0) << what;
      EXPECT_GE(pool->allocator_overhead_bytes, 0) << what << ": overhead " << pool->allocator_overhead_bytes;
    }
  } catch (const SchemaError&) {
  } catch (const SimError&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": simulate threw " << e.what();
  }
}

constexpr int kMutations = 300;

template <class T>
void fuzz(const T& seed, const char* type, const Seeds& s, int salt) {
  T unchanged;
  ASSERT_TRUE(read_or_refuse(to_json_string(seed), unchanged, std::string(type) + " unchanged")) << type;
  const json doc = json::parse(to_json_string(seed));
  std::mt19937 rng(static_cast<unsigned>(20261123 + salt));
  int accepted = 0;
  for (int i = 0; i < kMutations; ++i) {
    const std::string text = mutate(doc, rng);
    const std::string what = std::string(type) + " mutation " + std::to_string(i);
    T got;
    if (!read_or_refuse(text, got, what)) continue;
    ++accepted;
    if constexpr (std::is_same_v<T, Plan>) simulate_reads_back(s.model, s.cluster, got, what);
    if constexpr (std::is_same_v<T, ClusterProfile>) simulate_reads_back(s.model, got, s.plan, what);
    if constexpr (std::is_same_v<T, ModelProfile>) simulate_reads_back(got, s.cluster, s.plan, what);
  }
  // Some mutations (a junk key, a deleted optional field) must be refused, some accepted: neither all.
  EXPECT_GT(accepted, 0) << type;
  EXPECT_LT(accepted, kMutations) << type;
}

TEST(Fuzz, EveryDocumentTypeIsReadOrRefusedInOneLine) {
  const Seeds s;
  fuzz(s.plan, "plan", s, 1);
  fuzz(s.cluster, "cluster", s, 2);
  fuzz(s.model, "model profile", s, 3);
  fuzz(s.prediction, "prediction", s, 4);
  fuzz(s.record, "run record", s, 5);
  fuzz(s.comparison, "comparison", s, 6);
}

TEST(Fuzz, DeepNestingIsRefusedNamingTheDepth) {
  const std::string deep = "{\"schema\": \"zeroplan.plan/1\", \"world_size\": " + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  try {
    parse_document<Plan>(deep, "deep.json");
    FAIL() << "accepted";
  } catch (const SchemaError& e) {
    EXPECT_STREQ(e.what(), "deep.json: nested deeper than 64 levels (under \"world_size\")");
  }
}

}  // namespace
}  // namespace zeroplan::sim
