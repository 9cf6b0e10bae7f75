// Private to the zoo: per-model builders, option parsing, seeded initialisation and per-sample RNG.
#pragma once

#include <zeroplan/profiles/zoo.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zeroplan::zoo::detail {

// Builders, one per model file. `options` are complete (defaults filled in) and name-checked.
Model build_mlp(const Options& options, uint64_t seed, bool options_only = false);
Model build_gpt(const Options& options, uint64_t seed, bool options_only = false);
Model build_resnet(const Options& options, uint64_t seed, bool options_only = false);

// gpt's task, shared with TorchScript language models: next token of a fixed random Markov chain over
// `vocab` tokens; input [count, seq] int64, target the same shifted by one; cross-entropy on the last dim.
std::unique_ptr<Task> make_markov_language(uint64_t seed, int64_t vocab, int64_t seq);

ModelInfo mlp_info();
ModelInfo gpt_info();
ModelInfo resnet_info();

// Typed option values; a bad value throws SchemaError naming the model, the option and the value.
int64_t int_option(const std::string& model, const Options& options, const std::string& name,
                   int64_t min_value = 1);
double double_option(const std::string& model, const Options& options, const std::string& name,
                     double min_value, double max_value);
bool bool_option(const std::string& model, const Options& options, const std::string& name);
std::string choice_option(const std::string& model, const Options& options, const std::string& name,
                          const std::vector<std::string>& choices);

// SplitMix64: a tiny counter-based stream. Samples are drawn from Rng(sample_key(...)) so they do not
// depend on torch's generator algorithms, on the batch split, or on the order samples are drawn in.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Distinct streams for model parameters, the task's fixed teacher and each sample.
inline uint64_t teacher_key(uint64_t seed) { return mix64(seed ^ 0x7eac4e57eac4e5ULL); }
inline uint64_t sample_key(uint64_t seed, int64_t step, int64_t sample) {
  return mix64(mix64(mix64(seed ^ 0x5a3b1e5a3b1eULL) ^ static_cast<uint64_t>(step)) ^
               static_cast<uint64_t>(sample));
}

class Rng {
 public:
  explicit Rng(uint64_t key) : state_(key) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int64_t below(int64_t n) { return static_cast<int64_t>(uniform() * static_cast<double>(n)); }
  double normal();  // standard normal (Box-Muller)

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// Runs `build` with torch's default CPU generator state saved and restored, so building a model never
// perturbs the caller's random stream (module constructors draw default initialisations from it).
class DefaultGeneratorGuard {
 public:
  DefaultGeneratorGuard();
  ~DefaultGeneratorGuard();
  DefaultGeneratorGuard(const DefaultGeneratorGuard&) = delete;
  DefaultGeneratorGuard& operator=(const DefaultGeneratorGuard&) = delete;

 private:
  torch::Tensor state_;
};

// A CPU generator for parameter initialisation, seeded from the model seed.
at::Generator param_generator(uint64_t seed);

// Linear layers initialised like torch's default (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and
// bias), but from `gen`.
void init_linear_default(torch::nn::LinearImpl& linear, at::Generator& gen);

}  // namespace zeroplan::zoo::detail
