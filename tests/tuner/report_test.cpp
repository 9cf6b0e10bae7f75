#include "zeroplan/tuner/report.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fixtures.h"

namespace zeroplan::tuner {
namespace {

using testing::a100;
using testing::small_gpt;

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TuneResult small_result() {
  TuneConstraints c;
  c.set_global_batch(32).set_knobs({"zero_stage", "micro_batch", "offload_optimizer", "offload_grads", "precision"});
  return tune(small_gpt(), a100(1), c, TuneOptions{}.set_threads(2));
}

TEST(Report, WritesEveryFileAndTheHtmlIsSelfContained) {
  const TuneResult r = small_result();
  ASSERT_NE(r.best(), nullptr);
  const auto dir = std::filesystem::temp_directory_path() / "zeroplan_tuner_report_test";
  std::filesystem::remove_all(dir);
  const auto files = write_reports(r, dir);
  std::vector<std::string> names;
  for (const auto& f : files) {
    names.push_back(f.filename().string());
    EXPECT_TRUE(std::filesystem::exists(f)) << f;
  }
  for (const char* want : {"report.md", "report.html", "tune.json", "plan.json", "export_notes.md"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  const std::string html = slurp(dir / "report.html");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src=\""), std::string::npos);
  EXPECT_EQ(html.find("href=\""), std::string::npos);
  EXPECT_EQ(std::count(html.begin(), html.end(), '\n') > 10, true);
  int svgs = 0;
  for (std::size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) ++svgs;
  EXPECT_EQ(svgs, 3);
  const auto j = nlohmann::json::parse(slurp(dir / "tune.json"));
  EXPECT_EQ(j.at("schema"), kTuneSchema);
  EXPECT_EQ(j.at("ranking").size(), r.ranking.size());
  EXPECT_FALSE(j.at("pareto").empty());
  const std::string md = slurp(dir / "report.md");
  for (const char* section : {"## Winner", "## Why this plan", "## Ranking", "## Pareto front", "## Rejected", "## Exports"})
    EXPECT_NE(md.find(section), std::string::npos) << section;
  std::filesystem::remove_all(dir);
}

TEST(Report, ParetoFrontIsMonotone) {
  const TuneResult r = small_result();
  ASSERT_FALSE(r.pareto.empty());
  for (std::size_t i = 1; i < r.pareto.size(); ++i) {
    EXPECT_GT(r.pareto[i].prediction.device.total_bytes(), r.pareto[i - 1].prediction.device.total_bytes());
    EXPECT_GT(r.pareto[i].prediction.samples_per_s, r.pareto[i - 1].prediction.samples_per_s);
  }
  // The winner (fastest) is the front's last point.
  EXPECT_EQ(r.pareto.back().prediction.samples_per_s, r.best()->prediction.samples_per_s);
}

}  // namespace
}  // namespace zeroplan::tuner
