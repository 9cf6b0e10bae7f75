#include "zeroplan/profiles/trace.h"

#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zeroplan {
namespace {

using nlohmann::json;

json events_of(const TraceWriter& w) { return json::parse(w.json()).at("traceEvents"); }

TEST(TraceWriter, EmptyTraceIsTheFrame) {
  EXPECT_EQ(TraceWriter().json(), "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n]}\n");
}

TEST(TraceWriter, ExactText) {
  TraceWriter w;
  w.process_name(3, "p");
  w.thread_name(3, 1, "comm");
  w.thread_sort_index(3, 1, 1);
  w.span("fwd u0", "compute", 1.5, 1000, 3, 1, {{"id", 7}, {"warmup", true}, {"x", 0.25}, {"s", "a"}});
  w.counter("memory device", 2.0, 3, {{"bytes", std::int64_t{1} << 40}, {"peak_bytes", -1}});
  EXPECT_EQ(w.json(),
            "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":3,\"tid\":0,\"args\":{\"name\":\"p\"}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":3,\"tid\":1,\"args\":{\"name\":\"comm\"}},\n"
            "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":3,\"tid\":1,\"args\":{\"sort_index\":1}},\n"
            "{\"name\":\"fwd u0\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":1.500,\"dur\":1000.000,\"pid\":3,\"tid\":1,"
            "\"args\":{\"id\":7,\"warmup\":true,\"x\":0.25,\"s\":\"a\"}},\n"
            "{\"name\":\"memory device\",\"ph\":\"C\",\"ts\":2.000,\"pid\":3,\"args\":{\"bytes\":1099511627776,"
            "\"peak_bytes\":-1}}\n"
            "]}\n");
}

TEST(TraceWriter, EscapesStringsAndKeys) {
  const std::string nasty = std::string("q\"b\\n\nt\tr\rb\bf\fz") + '\x01' + '\x1f' + "\xc3\xa9";
  std::string escaped;
  append_json_escaped(escaped, nasty);
  EXPECT_EQ(escaped, "q\\\"b\\\\n\\nt\\tr\\rb\\bf\\fz\\u0001\\u001f\xc3\xa9");
  TraceWriter w;
  w.process_name(0, nasty);
  w.span(nasty, nasty, 0, 1, 0, 0, {{nasty, nasty}});
  w.counter(nasty, 0, 0, {{"v", 1}});
  const json e = events_of(w);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0]["args"]["name"], nasty);
  EXPECT_EQ(e[1]["name"], nasty);
  EXPECT_EQ(e[1]["cat"], nasty);
  EXPECT_EQ(e[1]["args"][nasty], nasty);
  EXPECT_EQ(e[2]["name"], nasty);
}

TEST(TraceWriter, NumbersAreFixedAndNonFiniteIsNull) {
  TraceWriter w;
  w.span("s", "c", 0.0004, 2.0 / 3.0, 0, 0,
         {{"third", 1.0 / 3.0}, {"inf", std::numeric_limits<double>::infinity()},
          {"nan", std::numeric_limits<double>::quiet_NaN()}, {"u", std::uint32_t{4000000000u}}});
  const std::string text = w.json();
  EXPECT_NE(text.find("\"ts\":0.000,\"dur\":0.667"), std::string::npos) << text;
  EXPECT_NE(text.find("\"third\":0.3333333333333333,\"inf\":null,\"nan\":null,\"u\":4000000000"), std::string::npos)
      << text;
  const json e = events_of(w);
  EXPECT_DOUBLE_EQ(e[0]["args"]["third"].get<double>(), 1.0 / 3.0);
}

// Metadata first, then spans by (pid, tid, ts) with ties in the order added, then counters and raw
// events in the order added, whatever order the calls came in.
TEST(TraceWriter, OrdersSectionsAndSpans) {
  TraceWriter w;
  w.counter("memory b", 5, 0, {{"bytes", 2}});
  w.span("late", "c", 9, 1, 0, 0);
  w.raw("{\"name\":\"copied\",\"ph\":\"i\",\"ts\":0}");
  w.span("other pid", "c", 0, 1, 1, 0);
  w.span("tid1", "c", 0, 1, 0, 1);
  w.span("early", "c", 1, 1, 0, 0);
  w.span("tie a", "c", 4, 1, 0, 0);
  w.span("tie b", "c", 4, 1, 0, 0);
  w.counter("memory a", 1, 0, {{"bytes", 1}});
  w.process_name(0, "p");
  const json e = events_of(w);
  std::vector<std::string> names;
  for (const auto& x : e) names.push_back(x["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"process_name", "early", "tie a", "tie b", "late", "tid1", "other pid",
                                             "memory b", "memory a", "copied"}));
  EXPECT_EQ(w.num_spans(), 6u);
  EXPECT_EQ(w.num_counters(), 2u);
}

TEST(TraceWriter, SameCallsGiveSameBytes) {
  auto build = [] {
    TraceWriter w;
    w.process_name(0, "zeroplan");
    for (int i = 20; i > 0; --i) {
      w.span("s" + std::to_string(i), "compute", i * 0.1, 0.1, 0, i % 3, {{"i", i}, {"f", i / 7.0}});
      w.counter("memory device", i * 0.1, 0, {{"bytes", i * 1000}});
    }
    return w.json();
  };
  const std::string a = build();
  EXPECT_EQ(a, build());
  EXPECT_EQ(json::parse(a).at("traceEvents").size(), 41u);
}

}  // namespace
}  // namespace zeroplan
