// zeroplan profile: measure a built-in or scripted model unit by unit, or derive a model too large to
// instantiate from closed forms, and write the ModelProfile.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "cli.h"
#include "model_args.h"
#include "python_bridge.h"
#include "zeroplan/profiles/analytic.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/profiler.h"
#include "zeroplan/profiles/trace.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::cli {
namespace {

struct ProfileArgs {
  std::string model, preset, torchscript, analytic, analytic_config, output, trace;
  std::optional<int64_t> intermediate;
  PythonModelArgs python;
  std::vector<std::string> sets;
  std::vector<int64_t> input_shape;
  std::optional<int64_t> layers, hidden, heads, seq, vocab;
  ProfileOptions options;
  uint64_t seed = 0;
  bool dtype_given = false;
  zoo::ScriptTask task;
};

// --analytic-config: a Hugging Face config.json (Llama, Mistral, Qwen2, GPT-2, MPT families).
ModelProfile analytic_config_profile(const ProfileArgs& a) {
  std::ifstream in(a.analytic_config, std::ios::binary);
  if (!in) throw ExitError(kBadInput, fmt::format("--analytic-config {}: cannot open", a.analytic_config));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto kv = parse_key_values(a.sets, "--opt");
  for (const auto& [k, v] : kv) {
    if (k != "attention" && k != "units")
      throw ExitError(kBadInput, fmt::format("--opt {}: not an option of --analytic-config (options: attention=flash|unfused, "
                                             "units=block|sub-block; the sizes come from the config)", k));
    if (k == "units" && v != "block" && v != "sub-block")
      throw ExitError(kBadInput, fmt::format("--opt units={}: expected block or sub-block", v));
  }
  return analytic_from_hf_config(text, a.analytic_config, a.options.batch, a.seq.value_or(0),
                                    a.dtype_given ? a.options.dtype : "bf16",
                                    kv.contains("attention") && kv.at("attention") == "flash",
                                    kv.contains("units") && kv.at("units") == "sub-block");
}

// --analytic llama|mpt: Llama-family (Llama, Mistral, Qwen2) and MPT decoders from closed forms.
ModelProfile analytic_decoder_profile(const ProfileArgs& a) {
  AnalyticDecoderOptions o;
  o.family = a.analytic;
  o.name = a.analytic;
  if (o.family != "llama" && o.family != "mpt")
    throw ExitError(kBadInput, fmt::format("--analytic {}: unknown family (families: gpt, llama, mpt)", a.analytic));
  o.layers = a.layers.value_or(o.layers);
  o.hidden = a.hidden.value_or(o.hidden);
  o.heads = a.heads.value_or(o.heads);
  o.seq = a.seq.value_or(o.seq);
  o.vocab = a.vocab.value_or(o.family == "mpt" ? 50432 : o.vocab);
  o.intermediate = a.intermediate.value_or(o.family == "mpt" ? 4 * o.hidden : o.intermediate);
  o.batch = a.options.batch;
  if (a.dtype_given) o.dtype = a.options.dtype;
  const std::vector<std::string> known = o.family == "llama"
      ? std::vector<std::string>{"kv_heads", "head_dim", "tied", "qkv_bias", "attention", "units"}
      : std::vector<std::string>{"expansion", "attention", "bias", "positions", "units"};
  for (const auto& [k, v] : parse_key_values(a.sets, "--opt")) {
    if (std::find(known.begin(), known.end(), k) == known.end())
      throw ExitError(kBadInput, fmt::format("--opt {}: not an option of --analytic {} (options: {}; sizes: --layers, "
                                             "--hidden, --heads, --seq, --vocab, --intermediate)",
                                             k, o.family, fmt::join(known, ", ")));
    auto integer = [&] {
      try {
        return std::stoll(v);
      } catch (const std::exception&) {
        throw ExitError(kBadInput, fmt::format("--opt {}={}: expected an integer", k, v));
      }
    };
    if (k == "kv_heads") o.kv_heads = integer();
    if (k == "head_dim") o.head_dim = integer();
    if (k == "expansion") o.intermediate = integer() * o.hidden;
    if (k == "tied") o.tied_embeddings = v != "false" && v != "0";
    if (k == "qkv_bias") o.qkv_bias = v != "false" && v != "0";
    if (k == "bias") o.biases = v != "false" && v != "0";
    if (k == "units") {  // FSDP's wrap: whole layers, or attention and MLP apart
      if (v != "block" && v != "sub-block")
        throw ExitError(kBadInput, fmt::format("--opt units={}: expected block or sub-block", v));
      o.sub_blocks = v == "sub-block";
    }
    if (k == "positions") {
      if (v != "alibi" && v != "learned")
        throw ExitError(kBadInput, fmt::format("--opt positions={}: expected alibi or learned", v));
      o.learned_positions = v == "learned" ? o.seq : 0;
    }
    if (k == "attention") {
      if (v != "unfused" && v != "flash")
        throw ExitError(kBadInput, fmt::format("--opt attention={}: expected unfused or flash", v));
      o.flash_attention = v == "flash";
    }
  }
  return analytic_decoder(o);
}

// --python FILE.py:FACTORY: the user's nn.Module, profiled by the Python package.
ModelProfile python_profile(const ProfileArgs& a, const Globals& g) {
  ProfileOptions options = a.options;
  options.progress = options.progress && !g.quiet;
  PythonModelArgs python = a.python;
  python.trace = a.trace;
  ModelProfile profile = profile_python(python, options);
  if (!a.trace.empty() && !g.quiet) fmt::print(stderr, "wrote {}\n", a.trace);
  return profile;
}

// --analytic gpt: a GPT from closed forms.
ModelProfile analytic_gpt_profile(const ProfileArgs& a) {
  AnalyticGptOptions o;
  o.layers = a.layers.value_or(o.layers);
  o.hidden = a.hidden.value_or(o.hidden);
  o.heads = a.heads.value_or(o.heads);
  o.seq = a.seq.value_or(o.seq);
  o.vocab = a.vocab.value_or(o.vocab);
  o.batch = a.options.batch;
  if (a.dtype_given) o.dtype = a.options.dtype;  // else the analytic default (fp16 mixed precision)
  auto kv = parse_key_values(a.sets, "--opt");
  for (const auto& [k, v] : kv)
    if (k != "tied" && k != "units" && k != "attention")
      throw ExitError(kBadInput, fmt::format("--opt {}: not an option of --analytic gpt (options: tied, units, attention; "
                                             "a Llama-style model is --analytic llama with --opt kv_heads=N and "
                                             "--intermediate N)", k));
  if (auto it = kv.find("tied"); it != kv.end()) o.tied_embeddings = it->second != "false" && it->second != "0";
  if (auto it = kv.find("units"); it != kv.end()) {  // FSDP's wrap: whole blocks, or attention and MLP apart
    if (it->second != "block" && it->second != "sub-block")
      throw ExitError(kBadInput, fmt::format("--opt units={}: expected block or sub-block", it->second));
    o.sub_blocks = it->second == "sub-block";
  }
  if (auto it = kv.find("attention"); it != kv.end()) {
    if (it->second != "unfused" && it->second != "flash")
      throw ExitError(kBadInput, fmt::format("--opt attention={}: expected unfused or flash", it->second));
    o.flash_attention = it->second == "flash";
  }
  return analytic_gpt(o);
}

// --model NAME or --torchscript FILE: built and measured unit by unit on this machine.
ModelProfile measured_profile(const ProfileArgs& a, const Globals& g) {
  zoo::Model model;
  if (!a.torchscript.empty()) {
    if (a.input_shape.empty())
      throw ExitError(kBadInput, "--torchscript needs --input-shape (one sample, without the batch dimension)");
    zoo::ScriptTask task = a.task;
    if (a.vocab) task.vocab = *a.vocab;  // --vocab is the token vocabulary of --task lm here
    model = zoo::load_torchscript(a.torchscript, a.input_shape, a.seed, task);
  } else {
    auto overrides = parse_key_values(a.sets, "--opt");
    auto put = [&](const char* key, const std::optional<int64_t>& v) {
      if (v) overrides[key] = std::to_string(*v);
    };
    put("layers", a.layers); put("hidden", a.hidden); put("heads", a.heads);
    put("seq", a.seq); put("vocab", a.vocab);
    model = zoo::build_model(a.model, a.preset, overrides, a.seed);
  }
  ProfileOptions options = a.options;
  options.progress = options.progress && !g.quiet;
  TraceWriter trace;
  ModelProfile profile = profile_model(model, options, a.trace.empty() ? nullptr : &trace);
  if (!a.torchscript.empty()) {
    // Named by its file, as `run` records a TorchScript run, so `compare` finds them the same model.
    profile.name = std::filesystem::path(a.torchscript).filename().string();
    profile.source = "torchscript:" + a.torchscript;
  }
  if (!a.trace.empty()) {
    std::ofstream out(a.trace, std::ios::binary);
    out << trace.json();
    if (!out) throw ExitError(kBadInput, fmt::format("{}: cannot write the trace", a.trace));
    if (!g.quiet) fmt::print(stderr, "wrote {}\n", a.trace);
  }
  return profile;
}

int run_profile(const ProfileArgs& a, const Globals& g) {
  if (a.analytic.empty()) check_device(a.options.device);
  int sources = !a.model.empty() + !a.torchscript.empty() + !a.analytic.empty() + !a.python.spec.empty() +
                !a.analytic_config.empty();
  if (sources != 1)
    throw ExitError(kBadInput, fmt::format(
        "give exactly one of --python, --model, --torchscript, --analytic, --analytic-config (got {})", sources));
  if (!a.trace.empty() && (!a.analytic.empty() || !a.analytic_config.empty()))
    throw ExitError(kBadInput, fmt::format("--trace: an {} profile runs nothing to trace",
                                           a.analytic.empty() ? "--analytic-config" : "--analytic"));
  ModelProfile profile;
  if (!a.analytic_config.empty()) profile = analytic_config_profile(a);
  else if (!a.analytic.empty() && a.analytic != "gpt") profile = analytic_decoder_profile(a);
  else if (!a.python.spec.empty()) profile = python_profile(a, g);
  else if (!a.analytic.empty()) profile = analytic_gpt_profile(a);
  else profile = measured_profile(a, g);
  if (!g.quiet) print_profile_table(profile, stderr);
  if (!a.output.empty()) {
    write_document(a.output, profile);
    if (!g.quiet) fmt::print(stderr, "wrote {}\n", a.output);
  }
  if (g.json) fmt::print("{}", to_json_string(profile));
  return kOk;
}

}  // namespace

Action add_profile(CLI::App& app, const Globals& globals) {
  auto a = std::make_shared<ProfileArgs>();
  app.add_option("--python", a->python.spec,
                 "Your own PyTorch model: FILE.py:FACTORY, FACTORY() returning (model, make_batch, loss_fn); "
                 "profiled by capture and replay");
  app.add_option("--units", a->python.policy,
                 "--python: the units, auto (the repeated blocks, as FSDP's transformer wrap policy) or "
                 "comma-separated classes or module names")
      ->capture_default_str();
  app.add_flag("--verbose", a->python.verbose, "--python: the Python traceback of a failure");
  app.add_option("--model", a->model, "Built-in model (see the list below)");
  app.add_option("--preset", a->preset, "Preset of the model, e.g. gpt2-tiny");
  app.add_option("--opt", a->sets, "Model option key=value (repeat or comma-separate), e.g. --opt layers=4");
  add_torchscript_options(app, a->torchscript, a->input_shape, a->task, /*with_vocab=*/false);
  app.add_option("--analytic", a->analytic, "Closed-form profile of a family too large to build: gpt, llama (Llama, "
                 "Mistral, Qwen2: --opt kv_heads=N,tied=,qkv_bias=,head_dim=), mpt (--opt expansion=R)");
  app.add_option("--analytic-config", a->analytic_config,
                 "Closed-form profile of a Hugging Face config.json (llama, mistral, qwen2, mpt, gpt2)");
  app.add_option("--intermediate", a->intermediate, "MLP width (analytic llama; mpt: expansion x hidden)");
  app.add_option("--layers", a->layers, "Transformer layers (gpt, analytic gpt)");
  app.add_option("--hidden", a->hidden, "Hidden size (gpt, analytic gpt)");
  app.add_option("--heads", a->heads, "Attention heads (gpt, analytic gpt)");
  app.add_option("--seq", a->seq, "Sequence length (gpt, analytic gpt)");
  app.add_option("--vocab", a->vocab, "Vocabulary size (gpt, analytic gpt; --torchscript --task lm)");
  app.add_option("--batch", a->options.batch, "Reference micro batch")->capture_default_str()->check(positive());
  app.add_option("--batches", a->options.batches, "Batches to fit each figure over (default: batch, 2 x batch)")
      ->delimiter(',');
  app.add_option("--warmup", a->options.warmup, "Untimed iterations per unit")->capture_default_str();
  app.add_option("--repeats", a->options.repeats, "Timed iterations per unit")->capture_default_str()->check(positive());
  app.add_option("--threads", a->options.threads, "Torch threads (0: torch's default)")->capture_default_str()
      ->check(threads_option());
  app.add_option("--concurrent-ranks", a->options.concurrent_ranks,
                 "Time each unit with this many ranks' worth of it computing at once (the run's local ranks; "
                 "CPU; 1: alone)")
      ->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--device", a->options.device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--dtype", a->options.dtype, "fp32 | fp16 | bf16")->capture_default_str();
  app.add_option("--seed", a->seed, "Model initialisation seed")->capture_default_str();
  app.add_flag("--progress", a->options.progress, "One line per unit on stderr");
  app.add_option("-o,--output", a->output, "Write the ModelProfile here")->check(output_path());
  app.add_option("--trace", a->trace, "Write the profiling run as a Chrome trace (Perfetto)")->check(output_path());
  return [a, &app, &globals] {
    a->dtype_given = app.count("--dtype") > 0;
    return run_profile(*a, globals);
  };
}

}  // namespace zeroplan::cli
