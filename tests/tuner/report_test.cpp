#include "zeroplan/tuner/report.h"
#include "zeroplan/profiles/errors.h"

#include <gtest/gtest.h>
#include <unistd.h>

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

// A tune folder is written whole or not at all: into a fresh sibling that takes the target's place. A
// previous tune's folder is replaced (a stale file of it does not survive into the new one); a folder
// holding anything else, or a file, is refused before any work with one line naming it; nothing is left
// beside the target.
TEST(Report, TheFolderIsReplacedWholeAndOnlyATuneFolder) {
  namespace fs = std::filesystem;
  const TuneResult r = small_result();
  const fs::path root = fs::temp_directory_path() / ("zeroplan_tuner_folder_test_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path dir = root / "tune";
  write_reports(r, dir);
  std::ofstream(dir / "stale.txt") << "from an older tune";
  write_reports(r, dir);
  EXPECT_TRUE(fs::exists(dir / "tune.json"));
  EXPECT_FALSE(fs::exists(dir / "stale.txt")) << "files of two tunes mixed";
  int beside = 0;
  for (const auto& e : fs::directory_iterator(root)) beside += e.path() != dir;
  EXPECT_EQ(beside, 0) << "temporary folders left beside the target";

  const fs::path foreign = root / "photos";
  fs::create_directories(foreign);
  std::ofstream(foreign / "holiday.jpg") << "x";
  try {
    check_report_folder(foreign);
    ADD_FAILURE() << "a folder of other files would be replaced";
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("holds other files (holiday.jpg) and no tune.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_reports(r, foreign), SchemaError);
  EXPECT_TRUE(fs::exists(foreign / "holiday.jpg"));
  const fs::path file = root / "notes.txt";
  std::ofstream(file) << "keep me";
  EXPECT_THROW(check_report_folder(file), SchemaError);
  EXPECT_NO_THROW(check_report_folder(root / "new"));
  fs::remove_all(root);
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
