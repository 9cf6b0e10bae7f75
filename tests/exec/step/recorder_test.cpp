// The executor's Recorder: its Chrome trace has the simulator's lanes, the spans in lane then time
// order with their step / unit / microbatch, and a "memory device" counter at every span's end.
#include "zeroplan/exec/recorder.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zeroplan::exec {
namespace {

TEST(Recorder, TraceHasLanesSpansAndMemoryCounters) {
  Recorder rec(2);
  std::int64_t live = 100, peak = 100;
  rec.set_live_probe([&] { return live; });
  rec.set_peak_probe([&] { return peak; });
  rec.begin_step(0, true);
  rec.span(Lane::compute, "forward \"embed\"", 0.001, 0.002, "forward", 0, 0);
  live = 300;
  peak = 400;
  rec.span(Lane::comm, "all_gather", 0.0005, 0.0015, "all_gather");
  rec.end_step();
  rec.begin_step(1, false);
  live = 200;
  rec.span(Lane::compute, "backward \"embed\"", 0.0030, 0.0025, "backward", 0, 1);  // ends before it starts
  const std::string text = rec.chrome_trace_json();
  EXPECT_EQ(text, rec.chrome_trace_json());
  const nlohmann::json events = nlohmann::json::parse(text).at("traceEvents");

  std::vector<std::string> lanes, spans;
  std::vector<nlohmann::json> counters;
  for (const auto& e : events) {
    EXPECT_EQ(e.at("pid"), 2);
    if (e.at("ph") == "M" && e.at("name") == "process_name") {
      EXPECT_EQ(e["args"]["name"], "zeroplan run rank 2");
    }
    if (e.at("ph") == "M" && e.at("name") == "thread_name") lanes.push_back(e["args"]["name"]);
    if (e.at("ph") == "X") spans.push_back(e.at("name"));
    if (e.at("ph") == "C") counters.push_back(e);
  }
  EXPECT_EQ(lanes, (std::vector<std::string>{"compute", "comm", "h2d", "d2h", "optimizer", "comm.rs"}));
  EXPECT_EQ(spans, (std::vector<std::string>{"forward \"embed\"", "backward \"embed\"", "all_gather"}));
  const auto& fwd = events[13];
  EXPECT_EQ(fwd.at("name"), "forward \"embed\"");
  EXPECT_EQ(fwd.at("cat"), "compute");
  EXPECT_EQ(fwd.at("tid"), 0);
  EXPECT_DOUBLE_EQ(fwd.at("ts").get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(fwd.at("dur").get<double>(), 1000.0);
  EXPECT_EQ(fwd.at("args"), (nlohmann::json{{"step", 0}, {"warmup", true}, {"unit", 0}, {"microbatch", 0}}));
  const auto& bwd = events[14];
  EXPECT_EQ(bwd.at("dur").get<double>(), 0.0);
  EXPECT_EQ(bwd.at("args"), (nlohmann::json{{"step", 1}, {"unit", 0}, {"microbatch", 1}}));
  EXPECT_EQ(events[15].at("args"), (nlohmann::json{{"step", 0}, {"warmup", true}}));
  ASSERT_EQ(counters.size(), 3u);
  for (const auto& c : counters) EXPECT_EQ(c.at("name"), "memory device");
  EXPECT_DOUBLE_EQ(counters[0].at("ts").get<double>(), 2000.0);
  EXPECT_EQ(counters[0].at("args"), (nlohmann::json{{"bytes", 100}, {"peak_bytes", 100}}));
  EXPECT_EQ(counters[1].at("args"), (nlohmann::json{{"bytes", 300}, {"peak_bytes", 400}}));
  EXPECT_EQ(counters[2].at("args"), (nlohmann::json{{"bytes", 200}, {"peak_bytes", 400}}));
}

TEST(Recorder, TraceWithoutProbesHasNoCounters) {
  Recorder rec(0);
  rec.begin_step(0, false);
  rec.span(Lane::optimizer, "adam", 0, 0.001, "optimizer");
  const nlohmann::json events = nlohmann::json::parse(rec.chrome_trace_json()).at("traceEvents");
  int spans = 0;
  for (const auto& e : events) {
    EXPECT_NE(e.at("ph"), "C");
    spans += e.at("ph") == "X";
  }
  EXPECT_EQ(spans, 1);
}

}  // namespace
}  // namespace zeroplan::exec
