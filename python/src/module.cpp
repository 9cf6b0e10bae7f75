// zeroplan._C: the C++ core for Python users. Thin: the unit choice and the capture of a unit's inputs
// happen in Python (they walk the user's module tree); every measurement, simulation and document is the
// C++ core's (profile_model, simulate, the JSON documents), so the CLI reads what Python writes.
//
// A unit of a Python model enters the profiler as a zoo::UnitModule whose forward calls a Python
// callable (the unit replayed on its captured inputs, zeroplan/_capture.py) under the GIL; its
// parameters are the Python module's own tensors, registered (not copied), so what the profiler moves to
// a device or dtype is what the model computes with.
#include <torch/csrc/utils/pybind.h>
#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine.h"
#include "zeroplan/exec/run.h"
#include "zeroplan/config.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/counting_allocator.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/profiler.h"
#include "zeroplan/profiles/trace.h"
#include "zeroplan/profiles/zoo.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/simulate.h"

namespace py = pybind11;

namespace zeroplan::python {
namespace {

// One unit: `replay(x)` returns the unit's primary output for the primary input x.
class PyUnit final : public zoo::UnitModule {
 public:
  PyUnit(py::object replay, const std::vector<std::pair<std::string, at::Tensor>>& params,
         const std::vector<std::pair<std::string, at::Tensor>>& buffers)
      : replay_(std::move(replay)) {
    // torch::nn::Module names may not contain dots; the registered tensor is the Python module's own.
    auto key = [](std::string name) {
      for (char& c : name)
        if (c == '.') c = '_';
      return name;
    };
    for (const auto& [name, p] : params) register_parameter(key(name), p, p.requires_grad());
    for (const auto& [name, b] : buffers) register_buffer(key(name), b);
  }
  ~PyUnit() override {
    py::gil_scoped_acquire gil;
    replay_ = py::object();
  }
  torch::Tensor forward(const torch::Tensor& input) override {
    py::gil_scoped_acquire gil;
    py::object y = replay_(input);
    return y.cast<at::Tensor>();
  }

 private:
  py::object replay_;
};

// The synthetic task of a Python model: `make_input(batch)` gives the tensor the first unit takes (the
// segment before the first block keys its captured batch by that tensor's shape); the last unit's output
// is the loss itself (the user's loss_fn ran inside it), so the task's loss is that scalar.
class PyTask final : public zoo::Task {
 public:
  PyTask(py::object make_input, std::vector<std::int64_t> sample_shape)
      : make_input_(std::move(make_input)), sample_shape_(std::move(sample_shape)) {}
  ~PyTask() override {
    py::gil_scoped_acquire gil;
    make_input_ = py::object();
  }
  zoo::Batch batch(std::int64_t /*step*/, std::int64_t /*first_sample*/, std::int64_t count) const override {
    py::gil_scoped_acquire gil;
    return zoo::Batch{make_input_(count).cast<at::Tensor>(), torch::zeros({})};
  }
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& /*target*/) const override {
    return output.sum();
  }
  std::vector<std::int64_t> sample_shape() const override { return sample_shape_; }

 private:
  py::object make_input_;
  std::vector<std::int64_t> sample_shape_;
};

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// units: a list of dicts {name, type, replay, params: [(name, tensor)], buffers: [(name, tensor)],
// borrowed: [(owner unit index, owner parameter name)]}; options: ProfileOptions' fields by name.
std::string profile_units(const std::string& name, const std::string& source, py::list units,
                          py::object make_input, std::vector<std::int64_t> sample_shape, py::dict options,
                          const std::string& trace_path) {
  zoo::Model model;
  model.name = name;
  for (py::handle h : units) {
    py::dict u = h.cast<py::dict>();
    zoo::Unit unit;
    unit.name = u["name"].cast<std::string>();
    unit.type = u["type"].cast<std::string>();
    unit.module = std::make_shared<PyUnit>(u["replay"].cast<py::object>(), u["params"].cast<Named>(),
                                           u["buffers"].cast<Named>());
    for (const auto& [owner, pname] : u["borrowed"].cast<std::vector<std::pair<int, std::string>>>()) {
      std::string key = pname;
      for (char& c : key)
        if (c == '.') c = '_';
      unit.borrowed.push_back({owner, key});
    }
    model.units.push_back(std::move(unit));
  }
  model.task = std::make_unique<PyTask>(std::move(make_input), std::move(sample_shape));

  ProfileOptions o;
  auto get = [&](const char* key, auto& field) {
    if (options.contains(key)) field = options[key].cast<std::decay_t<decltype(field)>>();
  };
  get("batch", o.batch);
  get("batches", o.batches);
  get("warmup", o.warmup);
  get("repeats", o.repeats);
  get("threads", o.threads);
  get("device", o.device);
  get("dtype", o.dtype);
  get("progress", o.progress);
  get("concurrent_ranks", o.concurrent_ranks);

  ModelProfile profile;
  TraceWriter trace;
  {
    py::gil_scoped_release release;  // the units take the GIL back when they run Python
    profile = profile_model(model, o, trace_path.empty() ? nullptr : &trace);
  }
  if (!trace_path.empty()) {  // the profiling run as a Chrome trace, the schema of every producer (trace.h)
    std::ofstream out(trace_path, std::ios::binary);
    out << trace.json();
    if (!out) throw SchemaError("profile: cannot write the trace " + trace_path);
  }
  profile.source = source;
  return to_json_string(profile);
}

// Simulates one step: the plan document (JSON text, "" for the default DDP plan of world_size x
// global_batch) with `sets` (knob -> text, as `--set`) applied, then validated.
std::string simulate(const std::string& profile_json, const std::string& cluster_spec, const std::string& plan_json,
                     int world_size, int global_batch, const std::vector<std::pair<std::string, std::string>>& sets) {
  const auto profile = parse_document<ModelProfile>(profile_json, "profile");
  const ClusterProfile cluster = resolve_cluster(cluster_spec);
  Plan plan = plan_json.empty() ? Plan::default_ddp(world_size, global_batch)
                                : parse_document<Plan>(plan_json, "plan");
  const Plan before = plan;
  std::set<std::string> given;
  for (const auto& [key, text] : sets) {
    const Knob& k = knob(key, "set");
    set_knob_text(plan, k, text, "set");
    given.insert(k.name);
  }
  apply_dependent_defaults(before, plan, given);
  validate(plan);
  py::gil_scoped_release release;
  return to_json_string(sim::simulate(profile, cluster, plan));
}

// The CPU pool of a recorded loop: a counting allocator installed until stop() (zeroplan.record).
class CpuMeter {
 public:
  CpuMeter() : scoped_(std::make_unique<ScopedCpuAllocator>()) {}
  std::int64_t live() const { return scoped_ ? scoped_->allocator().live_bytes() : 0; }
  std::int64_t peak() const { return scoped_ ? scoped_->allocator().peak_bytes() : 0; }
  void reset_peak() {
    if (scoped_) scoped_->allocator().reset_peak();
  }
  void stop() { scoped_.reset(); }

 private:
  std::unique_ptr<ScopedCpuAllocator> scoped_;
};

}  // namespace
}  // namespace zeroplan::python

PYBIND11_MODULE(_C, m) {
  using namespace zeroplan::python;
  m.doc() = "zeroplan's C++ core (profiler, simulator, documents) for the zeroplan package";
  m.attr("__version__") = ZEROPLAN_VERSION;
  m.attr("torch_version") = TORCH_VERSION;
  static py::exception<zeroplan::SchemaError> bad_input(m, "BadInput", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const zeroplan::SchemaError& e) {
      py::set_error(bad_input, e.what());
    } catch (const zeroplan::sim::SimError& e) {
      py::set_error(bad_input, e.what());
    } catch (const c10::Error& e) {
      py::set_error(PyExc_RuntimeError, zeroplan::zoo::torch_cause(e).c_str());
    }
  });
  m.def("profile_units", &profile_units, py::arg("name"), py::arg("source"), py::arg("units"), py::arg("make_input"),
        py::arg("sample_shape"), py::arg("options"), py::arg("trace_path") = "");
  m.def("simulate", &simulate, py::arg("profile_json"), py::arg("cluster"), py::arg("plan_json"),
        py::arg("world_size"), py::arg("global_batch"), py::arg("sets"));
  m.def("validate_document", [](const std::string& kind, const std::string& text) {
    using namespace zeroplan;
    if (kind == "model_profile") return to_json_string(parse_document<ModelProfile>(text, kind));
    if (kind == "run_record") return to_json_string(parse_document<RunRecord>(text, kind));
    if (kind == "prediction") return to_json_string(parse_document<Prediction>(text, kind));
    if (kind == "plan") return to_json_string(parse_document<Plan>(text, kind));
    throw SchemaError("validate_document: unknown kind " + kind);
  });
  // The unit times of `other_json` (the same model at another dtype) in the profile's times_at_dtype.
  m.def("add_times_at_dtype", [](const std::string& profile_json, const std::string& other_json) {
    using namespace zeroplan;
    auto profile = parse_document<ModelProfile>(profile_json, "profile");
    add_times_at_dtype(profile, parse_document<ModelProfile>(other_json, "profile at another dtype"));
    return to_json_string(profile);
  });
  m.def("prune_checkpoints", &zeroplan::exec::prune_checkpoints, py::arg("dir"), py::arg("newest"), py::arg("keep"),
        "Checkpoint retention (zeroplan/exec/run.h): interrupted saves, and all but the newest `keep`.");
  m.def("default_plan", [](int world_size, int global_batch) {
    return zeroplan::to_json_string(zeroplan::Plan::default_ddp(world_size, global_batch));
  });
  // A RunRecord from Python (zeroplan.record): step statistics computed as `run` computes them, validated.
  m.def("finish_run_record", [](const std::string& text) {
    using namespace zeroplan;
    auto j = nlohmann::json::parse(text);
    RunRecord r;
    // Statistics are placeholders in `text`; from_json validates them, so compute first.
    std::vector<double> times = j.at("step_times_s").get<std::vector<double>>();
    const int warmup = j.at("warmup_steps").get<int>();
    if (static_cast<int>(times.size()) <= warmup)
      throw SchemaError("run record: " + std::to_string(times.size()) + " steps with " + std::to_string(warmup) +
                        " warm-up steps");
    std::vector<double> measured(times.begin() + warmup, times.end());
    j["step_time_median_s"] = percentile(measured, 50);
    j["step_time_p10_s"] = percentile(measured, 10);
    j["step_time_p90_s"] = percentile(measured, 90);
    return to_json_string(parse_document<RunRecord>(j.dump(), "run record"));
  });
  py::class_<CpuMeter>(m, "CpuMeter")
      .def(py::init<>())
      .def("live", &CpuMeter::live)
      .def("peak", &CpuMeter::peak)
      .def("reset_peak", &CpuMeter::reset_peak)
      .def("stop", &CpuMeter::stop);
  bind_engine(m);
}
