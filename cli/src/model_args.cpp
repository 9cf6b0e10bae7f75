#include "model_args.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "cli.h"
#include "zeroplan/config.h"

namespace zeroplan::cli {

void add_torchscript_options(CLI::App& app, std::string& torchscript, std::vector<int64_t>& input_shape,
                             zoo::ScriptTask& task, bool with_vocab) {
  std::string kinds;
  for (const auto& [name, help] : zoo::script_task_kinds()) kinds += fmt::format("\n  {}: {}", name, help);
  CLI::Option* file = app.add_option("--torchscript", torchscript, "Scripted nn.Sequential whose top-level children are the units")
      ->check(CLI::ExistingFile);
  // Options of the TorchScript door only: given without a file, a line saying so (they were ignored).
  app.add_option("--input-shape", input_shape, "With --torchscript: one sample's input shape, e.g. 3,32,32")
      ->delimiter(',')->needs(file);
  app.add_option("--task", task.kind, "With --torchscript: the task it trains on:" + kinds)->capture_default_str()
      ->needs(file);
  app.add_option("--classes", task.classes, "With --task classify: number of classes (the output's last size)")
      ->needs(file);
  if (with_vocab) app.add_option("--vocab", task.vocab, "With --task lm: vocabulary size (tokens in [0, V))")->needs(file);
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

void check_device(const std::string& device) {
  if (device == "cpu") return;
  const bool cuda = device == "cuda" ||
                    (device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
                     device.find_first_not_of("0123456789", 5) == std::string::npos);
  if (!cuda) throw ExitError(kBadInput, fmt::format("--device {}: expected cpu, cuda or cuda:<i>", device));
#if ZEROPLAN_HAVE_CUDA
  if (!torch::cuda::is_available())
    throw ExitError(kNotPossibleHere, fmt::format("--device {}: no CUDA device is visible on this machine", device));
  const long index = device == "cuda" ? 0 : std::stol(device.substr(5));
  if (index >= static_cast<long>(torch::cuda::device_count()))
    throw ExitError(kNotPossibleHere, fmt::format("--device {}: this machine has {} CUDA device(s)", device,
                                                  torch::cuda::device_count()));
#else
  throw ExitError(kNotPossibleHere, fmt::format("--device {}: this build of zeroplan has no CUDA", device));
#endif
}

}  // namespace zeroplan::cli
