// The user's own model on the command line, shared by profile, run and autopilot (torch targets only):
// --torchscript FILE --input-shape D,... --task regress|classify|lm --classes N [--vocab V].
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "zeroplan/profiles/zoo.h"

namespace zeroplan::cli {

// Registers --torchscript, --input-shape, --task and --classes; `vocab` (lm) is registered when not
// null (profile already has --vocab, the gpt option, and passes nullptr).
void add_torchscript_options(CLI::App& app, std::string& torchscript, std::vector<int64_t>& input_shape,
                             zoo::ScriptTask& task, bool with_vocab = true);

// The same options as arguments for a child `zeroplan run` (empty without --torchscript).
std::vector<std::string> torchscript_argv(const std::string& torchscript, const std::vector<int64_t>& input_shape,
                                          const zoo::ScriptTask& task);

// --device before any work: cpu, cuda or cuda:<i> (else exit 1), and a CUDA device where one is asked
// for (else exit 2, not possible here: this build has no CUDA or no GPU is visible).
void check_device(const std::string& device);

}  // namespace zeroplan::cli
