#include "zeroplan/profiles/json_io.h"

#include <sys/stat.h>

#include <thread>

#include "schema_test_util.h"

namespace zeroplan {
namespace {

using testing::expect_error;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

// File -> object -> file is byte-identical, for every document kind.
template <class T>
void expect_file_round_trip(const T& document, const std::filesystem::path& file) {
  write_document(file, document);
  const std::string first = read_file(file);
  const T back = read_document<T>(file);
  EXPECT_TRUE(back == document);
  write_document(file, back);
  EXPECT_EQ(read_file(file), first);
}

TEST(JsonIo, FileRoundTripIsByteIdentical) {
  TempDir dir;
  expect_file_round_trip(testing::sample_model(), dir.path() / "model.json");
  expect_file_round_trip(resolve_cluster("h100-sxm-80gb:16"), dir.path() / "cluster.json");
  expect_file_round_trip(testing::sample_plan(), dir.path() / "plan.json");
  expect_file_round_trip(testing::sample_prediction(), dir.path() / "prediction.json");
  expect_file_round_trip(testing::sample_run_record(), dir.path() / "run.json");
  expect_file_round_trip(testing::sample_comparison(), dir.path() / "comparison.json");
}

TEST(JsonIo, DoublesRoundTripExactly) {
  Plan p = Plan::default_ddp(1, 1);
  for (double v : {0.1 + 0.2, 1.0 / 3.0, 5e-324, 1.7976931348623157e308, 123456789.123456789}) {
    p.optimizer.lr = v;
    EXPECT_EQ(parse_document<Plan>(to_json_string(p)).optimizer.lr, v);
  }
}

TEST(JsonIo, FormatIsTwoSpacesInSchemaOrder) {
  const std::string text = to_json_string(Plan::default_ddp(2, 8));
  EXPECT_EQ(text.rfind("{\n  \"schema\": \"zeroplan.plan/1\",\n  \"world_size\": 2,\n  \"global_batch\": 8,\n", 0), 0u)
      << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(schema_of(nlohmann::json::parse(text)), "zeroplan.plan/1");
  EXPECT_EQ(schema_of(nlohmann::json::array()), "");
}

TEST(JsonIo, ParseErrorGivesLineAndColumn) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "bad.json";
  write_file(file, "{\n  \"schema\": \"zeroplan.plan/1\",\n  \"world_size\": 2,,\n}\n");
  expect_error([&] { read_document<Plan>(file); },
               file.string() +
                   ":3:19: invalid JSON: syntax error while parsing object key - unexpected ','; expected string "
                   "literal");
  write_file(file, "");
  expect_error([&] { read_document<Plan>(file); },
               file.string() +
                   ":1:1: invalid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', "
                   "or a literal");
}

TEST(JsonIo, ErrorsNameTheFile) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "plan.json";
  expect_error([&] { read_document<Plan>(file); }, file.string() + ": cannot open: No such file or directory");
  write_file(file, R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 33, "micro_batch": 17,
                       "microbatches": 2, "zero_stage": 0})");
  expect_error([&] { read_document<Plan>(file); },
               file.string() + ": plan: global_batch 33 != micro_batch 17 x microbatches 2 x world_size 2 (= 68)");
  write_file(file, "[1, 2]");
  expect_error([&] { read_document<Plan>(file); }, file.string() + ": plan: expected an object, got array");
}

TEST(JsonIo, WriteIsAtomicAndValidates) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "plan.json";
  write_document(file, Plan::default_ddp(2, 8));
  const std::string before = read_file(file);
  Plan bad = Plan::default_ddp(2, 8);
  bad.global_batch = 9;
  expect_error([&] { write_document(file, bad); },
               file.string() + ": not written: plan: global_batch 9 != micro_batch 4 x microbatches 1 x world_size 2 (= 8)");
  EXPECT_EQ(read_file(file), before);
  // Nothing but the document is left in the directory (no temporary files).
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1u);
  expect_error([&] { write_document(dir.path() / "no" / "such" / "dir.json", Plan::default_ddp(1, 1)); },
               (dir.path() / "no" / "such" / "dir.json").string() + ": cannot write: No such file or directory");
}

// -o onto a symlink writes its target (the link stays a link); onto a pipe writes into it (the pipe
// stays a pipe, never replaced by a file); a folder or a missing folder is refused before any work.
TEST(JsonIo, OutputsAreNeverReplacedUnlessRegularFiles) {
  TempDir dir;
  const std::filesystem::path target = dir.path() / "real.json", link = dir.path() / "link.json";
  write_file(target, "old");
  std::filesystem::create_symlink(target, link);
  EXPECT_NO_THROW(check_output(link));
  write_document(link, Plan::default_ddp(2, 8));
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(read_document<Plan>(target), Plan::default_ddp(2, 8));

  const std::filesystem::path fifo = dir.path() / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NO_THROW(check_output(fifo));
  std::string received;
  std::thread reader([&] { received = read_file(fifo); });
  write_document(fifo, Plan::default_ddp(1, 1));
  reader.join();
  EXPECT_EQ(received, to_json_string(Plan::default_ddp(1, 1)));
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));

  expect_error([&] { check_output(dir.path()); }, dir.path().string() + ": cannot write: it is a directory");
  expect_error([&] { check_output(dir.path() / "no" / "x.json"); },
               (dir.path() / "no" / "x.json").string() + ": cannot write: no folder " + (dir.path() / "no").string());
  expect_error([&] { check_output(""); }, "output path is empty");
}

TEST(JsonIo, DuplicateKeysAreAnError) {
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 8, "micro_batch": 4,
                                 "microbatches": 1, "zero_stage": 3, "offload": {"params": true, "params": false}})",
                             "p.json");
      },
      "p.json: duplicate key \"params\"");
  // The same key in different objects is fine.
  EXPECT_TRUE(parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 1, "global_batch": 1,
      "micro_batch": 1, "microbatches": 1, "zero_stage": 3, "offload": {"optimizer": true},
      "optimizer": {"name": "adam"}})").offload.optimizer);
}

TEST(JsonIo, NumberOverflowNamesTheField) {
  expect_error(
      [] {
        parse_document<Plan>(R"({"schema": "zeroplan.plan/1", "world_size": 2, "global_batch": 1e999})", "p.json");
      },
      "p.json: number overflow parsing '1e999' (the value of \"global_batch\")");
}

TEST(JsonIo, ErrorMessagesAreOneLine) {
  try {
    parse_document<Plan>("{\n\"schema\": \"zeroplan.plan/1\",\n\"world_size\": tru\n}", "x.json");
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("x.json:3:", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace zeroplan
