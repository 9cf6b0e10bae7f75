// The model zoo: built-in models as sequences of units, each with a learnable synthetic task.
//
// Contract shared by the profiler (profiles/) and the executor (exec/):
// - A model is an ordered list of units; unit i's forward takes unit i-1's output (unit 0 takes the
//   task's input). Each unit is a torch::nn::Module whose forward maps one Tensor to one Tensor.
// - Every parameter is owned by exactly one unit (it appears in that unit's parameters()). A unit may
//   also *use* a parameter owned by an earlier unit (tied weights: the GPT head uses the token
//   embedding of unit 0); such uses are listed in Unit::borrowed, and the borrowing module does NOT
//   register the parameter, so counting parameters unit by unit counts it once. The borrowing module
//   reads the owner's parameter at every forward, so whatever the executor has put in it (gathered,
//   offloaded, set_data on a flat buffer view) is what the borrower uses, and its gradient accumulates
//   into the owner's parameter.
// - Models are deterministic from the seed: the same name, options and seed give bitwise-equal
//   parameters on every rank and every run. Building draws from a private generator and leaves torch's
//   default generator as it was. Models are built on the CPU in float32, in training mode.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace zeroplan::zoo {

// A unit module: one Tensor in, one Tensor out.
class UnitModule : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
};

struct BorrowedParam {
  int owner_unit = 0;        // index of the unit that owns (registers) the parameter
  std::string owner_name;    // the parameter's name inside the owner, e.g. "wte.weight"
};

struct Unit {
  std::string name;          // "embed", "block3", "head", "layer2"
  std::string type;          // "Embedding", "TransformerBlock", "Head", "Linear", "ResNetStage", ...
  std::shared_ptr<UnitModule> module;
  std::vector<BorrowedParam> borrowed;
};

// One batch of the synthetic task. input feeds unit 0; target feeds Task::loss.
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
};

// A learnable synthetic task, deterministic from (seed, step, sample index): sample j of step s is the
// same whichever rank or micro batch draws it, so a 2-rank run and a 1-process run see the same data.
class Task {
 public:
  virtual ~Task() = default;
  // Samples [first_sample, first_sample + count) of step `step`, on the CPU. Every zoo task generates
  // each sample on its own from a stream keyed by (seed, step, sample index).
  virtual Batch batch(int64_t step, int64_t first_sample, int64_t count) const = 0;
  // Mean loss over the batch (a scalar).
  virtual torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const = 0;
  // Shape of one sample's input (without the batch dimension), for profiles and --help.
  virtual std::vector<int64_t> sample_shape() const = 0;
  // Whether batch() may run on another thread while the step computes (a data loader's worker): true
  // for the zoo's tasks (pure functions of their keys); a task that calls back into Python says no.
  virtual bool batches_in_background() const { return false; }
  // Whether the task draws its samples on `device` itself (batch_on), as benchmarks' synthetic-data
  // loaders do on a GPU: the zoo's image task on CUDA, where the CPU would make a 256-image ResNet batch
  // slower than the device trains on it.
  virtual bool draws_on(const torch::Device& device) const {
    (void)device;
    return false;
  }
  // Samples [first_sample, first_sample + count) of `step` made on `device` where draws_on(device): the
  // same classes as batch(), the noise from the device's generator seeded per sample with the same key
  // (other bits than the CPU's, the same on every run). Elsewhere batch() on the CPU.
  virtual Batch batch_on(const torch::Device& device, int64_t step, int64_t first_sample, int64_t count) const {
    (void)device;
    return batch(step, first_sample, count);
  }
};

struct Model {
  std::string name;          // "gpt", "mlp", "resnet", "torchscript"
  std::string preset;        // "gpt2-tiny" or "" when built from options
  std::vector<Unit> units;
  std::unique_ptr<Task> task;
  int64_t parameter_count() const;  // sum over units of owned parameters
};

// Options of a model, as strings from the command line (e.g. {"layers","2"},{"hidden","64"}).
using Options = std::map<std::string, std::string>;

struct OptionInfo {
  std::string name;
  std::string default_value;
  std::string help;
};

struct ModelInfo {
  std::string name;
  std::string description;                       // one line
  std::vector<OptionInfo> options;
  std::map<std::string, Options> presets;        // preset name -> options
};

// A built-in model's ModelProfile source: "zoo:<name>", "zoo:<name>/<preset>" with a preset (what the
// profiler writes, what `run --profile` checks a profile against).
inline std::string profile_source(const std::string& name, const std::string& preset) {
  return "zoo:" + name + (preset.empty() ? "" : "/" + preset);
}

// The registry. Errors a user can cause (unknown model, preset or option, bad value) throw
// zeroplan::SchemaError with one line naming what is wrong and what exists.
const std::vector<ModelInfo>& registered_models();
const ModelInfo& model_info(const std::string& name);
// Options from a preset (may be empty) overridden by explicit options, checked against the model's.
Options resolve_options(const std::string& name, const std::string& preset, const Options& overrides);
Model build_model(const std::string& name, const std::string& preset, const Options& overrides,
                  uint64_t seed);
// What build_model checks of the options (names, ranges, e.g. layers >= 1, hidden divisible by heads),
// without building anything: a launcher checks a model of any size before its ranks start.
void check_options(const std::string& name, const std::string& preset, const Options& overrides);

// The task a TorchScript model trains on, stated by the user (`--task`):
// - regress: inputs N(0, 1); MSE of the output onto one fixed N(0, 1) target of the output's shape;
// - classify: `classes` classes, each a fixed N(0, 1) prototype input (from the seed); a sample is its
//   class's prototype plus N(0, 1) noise; cross-entropy of an output [batch, classes];
// - lm: integer token inputs in [0, vocab) of the sample shape [T], next token of a fixed random Markov
//   chain (gpt's task); cross-entropy of an output [batch, T, vocab].
struct ScriptTask {
  std::string kind = "regress";  // regress | classify | lm
  int64_t classes = 0;           // classify
  int64_t vocab = 0;             // lm
};
// The kinds with a one-line description each, for --help and errors.
const std::vector<std::pair<std::string, std::string>>& script_task_kinds();

// A scripted module whose top-level children are the units (nn.Sequential-style); sample_shape is
// the input shape of one sample. A child that writes its input in place (ReLU(inplace=True)) gets a
// copy of its input (the unit's type says so). Errors name the file, the child and torch's cause.
Model load_torchscript(const std::string& path, const std::vector<int64_t>& sample_shape,
                       uint64_t seed, const ScriptTask& task = {});

// torch's own cause of a failure in one line: for a TorchScript interpreter error, the Python-style
// exception line ("RuntimeError: ...") rather than "The following operation failed ...".
std::string torch_cause(const std::exception& error);

}  // namespace zeroplan::zoo
