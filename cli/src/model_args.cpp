#include "model_args.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

namespace zeroplan::cli {

void add_torchscript_options(CLI::App& app, std::string& torchscript, std::vector<int64_t>& input_shape,
                             zoo::ScriptTask& task, bool with_vocab) {
  std::string kinds;
  for (const auto& [name, help] : zoo::script_task_kinds()) kinds += fmt::format("\n  {}: {}", name, help);
  app.add_option("--torchscript", torchscript, "Scripted nn.Sequential whose top-level children are the units")
      ->check(CLI::ExistingFile);
  app.add_option("--input-shape", input_shape, "With --torchscript: one sample's input shape, e.g. 3,32,32")
      ->delimiter(',');
  app.add_option("--task", task.kind, "With --torchscript: the task it trains on:" + kinds)->capture_default_str();
  app.add_option("--classes", task.classes, "With --task classify: number of classes (the output's last size)");
  if (with_vocab) app.add_option("--vocab", task.vocab, "With --task lm: vocabulary size (tokens in [0, V))");
}

std::vector<std::string> torchscript_argv(const std::string& torchscript, const std::vector<int64_t>& input_shape,
                                          const zoo::ScriptTask& task) {
  if (torchscript.empty()) return {};
  std::vector<std::string> args{"--torchscript", torchscript, "--input-shape", fmt::format("{}", fmt::join(input_shape, ",")),
                                "--task", task.kind};
  if (task.classes > 0) args.insert(args.end(), {"--classes", std::to_string(task.classes)});
  if (task.vocab > 0) args.insert(args.end(), {"--vocab", std::to_string(task.vocab)});
  return args;
}

}  // namespace zeroplan::cli
