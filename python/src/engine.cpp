// zeroplan._C's training half: the rank's session (rendezvous and communicator, as `zeroplan run`'s ranks
// join) and the hook driver (zeroplan/exec/hook_driver.h) that python/zeroplan/_engine.py calls from the
// model's module and autograd hooks. Calls that may wait on other ranks release the GIL.
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <tuple>
#include <vector>

#include "engine.h"
#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/hook_driver.h"
#include "zeroplan/exec/recorder.h"
#include "zeroplan/exec/rendezvous.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/plan.h"

namespace py = pybind11;

namespace zeroplan::python {
namespace {

using exec::HookDriver;

// This process's rank in its job: torchrun's (or Slurm's, or zeroplan's launcher's) variables, or a world
// of one. One per process, like torch.distributed's default group.
class Session {
 public:
  Session(const std::string& device, double timeout_s) {
    exec::RankContext ctx = exec::rank_context_from_env();
    exec::RendezvousOptions opt;
    opt.device = device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
    if (timeout_s > 0) opt.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
    session_ = exec::join(ctx, opt);
  }
  int rank() const { return session_->context().rank; }
  int world_size() const { return session_->context().world_size; }
  int local_rank() const { return session_->context().local_rank; }
  std::string launcher() const { return session_->context().launcher; }
  exec::Communicator& comm() { return session_->comm(); }
  void set_step(std::int64_t s) { session_->set_step(s); }
  void finish() { session_->finish(); }
  void fail(const std::string& m) { session_->fail(m); }

 private:
  std::unique_ptr<exec::RankSession> session_;
};

// One saved tensor held by the activation-offload piece (what Python's pack hook returns).
struct Packed {
  std::shared_ptr<torch::autograd::SavedVariableHooks> hooks;
  torch::Tensor unpack() { return hooks->call_unpack_hook(); }
};

std::vector<std::pair<std::string, torch::Tensor>> named_list(const py::handle& items) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : items) {
    auto pair = item.cast<py::tuple>();
    out.emplace_back(pair[0].cast<std::string>(), pair[1].cast<torch::Tensor>());
  }
  return out;
}

// The device, recorder and driver of one wrapped model.
class Driver {
 public:
  Driver(Session& session, const py::list& units, const std::string& plan_json, const std::string& device,
         int ranks_per_node, bool keep_spans, std::int64_t memory_limit)
      : session_(session), device_(exec::make_device(device)), recorder_(session.rank(), keep_spans) {
    if (memory_limit > 0) device_->set_limit(memory_limit);
    std::vector<exec::HookUnitSpec> specs;
    for (const auto& item : units) {
      auto d = item.cast<py::dict>();
      exec::HookUnitSpec s;
      s.name = d["name"].cast<std::string>();
      s.type = d["type"].cast<std::string>();
      s.params = named_list(d["params"]);
      s.buffers = named_list(d["buffers"]);
      for (const auto& b : d["borrowed"]) {
        auto pair = b.cast<py::tuple>();
        s.borrowed.push_back({pair[0].cast<int>(), pair[1].cast<std::string>()});
      }
      specs.push_back(std::move(s));
    }
    const Plan plan = parse_document<Plan>(plan_json, "plan");
    exec::ExecOptions opt;
    opt.ranks_per_node = ranks_per_node;
    py::gil_scoped_release release;
    driver_ = std::make_unique<HookDriver>(std::move(specs), plan, session.comm(), *device_, recorder_, opt);
    device_->reset_peak();
    device_->host_pool().reset_peak();
  }
  HookDriver& d() { return *driver_; }
  exec::Device& device() { return *device_; }
  exec::Recorder& recorder() { return recorder_; }
  Packed pack(const torch::Tensor& t) { return Packed{driver_->pack(t)}; }

 private:
  Session& session_;
  std::unique_ptr<exec::Device> device_;
  exec::Recorder recorder_;
  std::unique_ptr<HookDriver> driver_;
};

py::dict stats_dict(const exec::StepStats& s) {
  py::dict d;
  d["time_s"] = s.time_s;
  d["loss_scale"] = s.loss_scale;
  d["skipped"] = s.skipped;
  d["lr_gain"] = s.lr_gain;
  d["phase_s"] = s.phase_s;
  return d;
}

}  // namespace

void bind_engine(py::module_& m) {
  using release = py::call_guard<py::gil_scoped_release>;
  static py::exception<exec::ExecError> exec_error(m, "ExecError", PyExc_RuntimeError);
  static py::exception<exec::OutOfDeviceMemory> oom(m, "OutOfDeviceMemory", exec_error.ptr());
  static py::exception<exec::CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  static py::exception<exec::RendezvousError> rdv_error(m, "RendezvousError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const exec::OutOfDeviceMemory& e) {
      py::set_error(oom, e.what());
    } catch (const exec::ExecError& e) {
      py::set_error(exec_error, e.what());
    } catch (const exec::CommError& e) {
      py::set_error(comm_error, e.what());
    } catch (const exec::RendezvousError& e) {
      py::set_error(rdv_error, e.what());
    }
  });

  py::class_<Session>(m, "Session")
      .def(py::init<const std::string&, double>(), py::arg("device") = "cpu", py::arg("timeout_s") = 0.0, release())
      .def_property_readonly("rank", &Session::rank)
      .def_property_readonly("world_size", &Session::world_size)
      .def_property_readonly("local_rank", &Session::local_rank)
      .def_property_readonly("launcher", &Session::launcher)
      .def("set_step", &Session::set_step)
      .def("finish", &Session::finish, release())
      .def("fail", &Session::fail, release());

  py::class_<Packed>(m, "Packed").def("unpack", &Packed::unpack, release());

  py::class_<Driver>(m, "Driver")
      .def(py::init<Session&, const py::list&, const std::string&, const std::string&, int, bool, std::int64_t>(),
           py::arg("session"), py::arg("units"), py::arg("plan_json"), py::arg("device") = "cpu",
           py::arg("ranks_per_node") = 0, py::arg("keep_spans") = false, py::arg("memory_limit") = 0,
           py::keep_alive<1, 2>())
      .def_property_readonly("unit_count", [](Driver& d) { return d.d().unit_count(); })
      .def_property_readonly("microbatches", [](Driver& d) { return d.d().microbatches(); })
      .def_property_readonly("grads_in_place", [](Driver& d) { return d.d().grads_in_place(); })
      .def("param_names", [](Driver& d, int u) { return d.d().param_names(u); })
      .def("checkpointed", [](Driver& d, int u) { return d.d().checkpointed(u); })
      // c10's names: "Float", "BFloat16", "Half"
      .def_property_readonly("compute_dtype", [](Driver& d) { return std::string(c10::toString(d.d().compute_dtype())); })
      .def_property_readonly("param_dtype", [](Driver& d) { return std::string(c10::toString(d.d().param_dtype())); })
      .def_property_readonly("autocast", [](Driver& d) { return d.d().autocast(); })
      .def("begin_forward", [](Driver& d, int micro, std::int64_t step) { d.d().begin_forward(micro, step); }, release())
      .def("before_forward", [](Driver& d, int u) { d.d().before_forward(u); }, release())
      .def("after_forward", [](Driver& d, int u) { d.d().after_forward(u); }, release())
      .def("end_eval", [](Driver& d) { d.d().end_eval(); }, release())
      .def("backward_scale", [](Driver& d) { return d.d().backward_scale(); })
      .def("before_backward", [](Driver& d, int u) { d.d().before_backward(u); }, release())
      .def("accumulate", [](Driver& d, int u, int slot, const torch::Tensor& g) { d.d().accumulate(u, slot, g); },
           release())
      .def("backward_done", [](Driver& d, int u) { d.d().backward_done(u); }, release())
      .def("end_backward", [](Driver& d) { d.d().end_backward(); }, release())
      .def("step", [](Driver& d) {
        exec::StepStats s;
        {
          py::gil_scoped_release r;
          s = d.d().step();
        }
        return stats_dict(s);
      })
      .def_property_readonly("offload_on", [](Driver& d) { return d.d().offload_on(); })
      .def("begin_capture",
           [](Driver& d, int u, const py::object& in) {
             return d.d().begin_capture(u, in.is_none() ? torch::Tensor() : in.cast<torch::Tensor>());
           },
           py::arg("u"), py::arg("input") = py::none())
      .def("pack", &Driver::pack)
      .def("end_capture", [](Driver& d, int u, const torch::Tensor& in, const torch::Tensor& out) {
        d.d().end_capture(u, in, out);
      }, release())
      .def("full_parameters", [](Driver& d) { return d.d().full_parameters(); }, release())
      .def("local_shards", [](Driver& d) {
        std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::int64_t, torch::Tensor>> out;
        for (auto& e : d.d().local_shards()) out.emplace_back(e.name, e.shape, e.offset, e.values);
        return out;
      }, release())
      .def("save_checkpoint", [](Driver& d, const std::string& dir, std::int64_t step) { d.d().save_checkpoint(dir, step); },
           release())
      .def("load_checkpoint", [](Driver& d, const std::string& dir, bool other_run) { return d.d().load_checkpoint(dir, other_run); },
           py::arg("dir"), py::arg("other_run") = false, release())
      .def("views_valid", [](Driver& d) { return d.d().views_valid(); })
      .def("peak_bytes", [](Driver& d) { return d.device().peak_bytes(); })
      .def("live_bytes", [](Driver& d) { return d.device().live_bytes(); })
      .def("host_peak_bytes", [](Driver& d) { return d.device().host_pool().peak_bytes(); })
      .def("reset_peak", [](Driver& d) {
        d.device().reset_peak();
        d.device().host_pool().reset_peak();
      })
      .def("trace_json", [](Driver& d) { return d.recorder().chrome_trace_json(); });
}

}  // namespace zeroplan::python
