#include "zeroplan/profiles/prediction.h"

#include <array>
#include <cmath>

#include "json_util.h"

namespace zeroplan {

namespace {

constexpr const char* kPredictionWhere = "prediction";

[[noreturn]] void prediction_error(const std::string& message) { fail(kPredictionWhere, message); }

ojson write_item(const ResidentItem& r) {
  ojson j;
  j["category"] = r.category;
  j["name"] = r.name;
  j["bytes"] = r.bytes;
  return j;
}

ojson write_pool(const PoolPeak& p) {
  ojson j;
  j["peak_bytes"] = p.peak_bytes;
  j["allocator_overhead_bytes"] = p.allocator_overhead_bytes;
  j["capacity_bytes"] = p.capacity_bytes;
  j["at_s"] = p.at_s;
  j["resident"] = write_array(p.resident, write_item);
  return j;
}

ojson write_unit_timing(const UnitTiming& u) {
  ojson j;
  j["name"] = u.name;
  j["fwd_start_s"] = u.fwd_start_s;
  j["fwd_s"] = u.fwd_s;
  j["bwd_start_s"] = u.bwd_start_s;
  j["bwd_s"] = u.bwd_s;
  return j;
}

ojson write_stage_prediction(const StagePrediction& s) {
  ojson j;
  j["first_unit"] = s.first_unit;
  j["units"] = s.units;
  j["device"] = write_pool(s.device);
  j["host_peak_bytes"] = s.host_peak_bytes;
  j["compute_busy_s"] = s.compute_busy_s;
  return j;
}

void check_non_negative(const std::string& field, double v) {
  if (!(v >= 0)) prediction_error(field + " must be >= 0 (got " + num(v) + ")");
}

void check_non_negative(const std::string& field, std::int64_t v) {
  if (v < 0) prediction_error(field + " must be >= 0 (got " + num(v) + ")");
}

void check_pool(const std::string& pool, const PoolPeak& p) {
  check_non_negative(pool + ".peak_bytes", p.peak_bytes);
  check_non_negative(pool + ".allocator_overhead_bytes", p.allocator_overhead_bytes);
  check_non_negative(pool + ".capacity_bytes", p.capacity_bytes);
  check_non_negative(pool + ".at_s", p.at_s);
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < p.resident.size(); ++i) {
    const ResidentItem& r = p.resident[i];
    const std::string at = pool + ".resident[" + std::to_string(i) + "]";
    if (r.category != "params" && r.category != "grads" && r.category != "optimizer" &&
        r.category != "activations" && r.category != "buffers" && r.category != "overhead")
      prediction_error(at + ".category must be one of \"params\", \"grads\", \"optimizer\", \"activations\", "
                       "\"buffers\", \"overhead\" (got " + quote_json(r.category) + ")");
    check_non_negative(at + ".bytes", r.bytes);
    sum += r.bytes;
  }
  if (sum > p.peak_bytes)
    prediction_error(pool + ": resident bytes sum to " + num(sum) + " > peak_bytes " + num(p.peak_bytes));
}

}  // namespace

void read_value(const nlohmann::json& j, ResidentItem& item, const std::string& path) {
  ObjectReader r(j, path);
  r.req("category", item.category);
  r.req("name", item.name);
  r.req("bytes", item.bytes);
  r.finish();
}

void read_value(const nlohmann::json& j, PoolPeak& p, const std::string& path) {
  ObjectReader r(j, path);
  r.req("peak_bytes", p.peak_bytes);
  r.opt("allocator_overhead_bytes", p.allocator_overhead_bytes);
  r.req("capacity_bytes", p.capacity_bytes);
  r.opt("at_s", p.at_s);
  r.opt("resident", p.resident);
  r.finish();
}

void read_value(const nlohmann::json& j, UnitTiming& u, const std::string& path) {
  ObjectReader r(j, path);
  r.req("name", u.name);
  r.req("fwd_start_s", u.fwd_start_s);
  r.req("fwd_s", u.fwd_s);
  r.req("bwd_start_s", u.bwd_start_s);
  r.req("bwd_s", u.bwd_s);
  r.finish();
}

void read_value(const nlohmann::json& j, StagePrediction& s, const std::string& path) {
  ObjectReader r(j, path);
  r.req("first_unit", s.first_unit);
  r.req("units", s.units);
  r.req("device", s.device);
  r.req("host_peak_bytes", s.host_peak_bytes);
  r.req("compute_busy_s", s.compute_busy_s);
  r.finish();
}

ojson write_model_states(const ModelStates& m) {
  ojson j;
  j["device"] = {{"params", m.device_params}, {"grads", m.device_grads}, {"optimizer", m.device_optimizer}};
  j["host"] = {{"params", m.host_params}, {"grads", m.host_grads}, {"optimizer", m.host_optimizer}};
  return j;
}

void read_value(const nlohmann::json& j, ModelStates& m, const std::string& path) {
  ObjectReader r(j, path);
  for (const auto& [pool, fields] : {std::pair{"device", std::array{&m.device_params, &m.device_grads, &m.device_optimizer}},
                                     std::pair{"host", std::array{&m.host_params, &m.host_grads, &m.host_optimizer}}}) {
    const nlohmann::json* v = r.take(pool, true);
    if (v == nullptr) continue;
    ObjectReader q(*v, r.sub(pool));
    q.req("params", *fields[0]);
    q.req("grads", *fields[1]);
    q.req("optimizer", *fields[2]);
    q.finish();
  }
  r.finish();
}

ojson to_ordered_json(const Prediction& p) {
  ojson j;
  j["schema"] = kPredictionSchema;
  j["model"] = p.model;
  j["cluster"] = p.cluster;
  j["step_time_s"] = p.step_time_s;
  j["sync_step_time_s"] = p.sync_step_time_s;
  j["samples_per_s"] = p.samples_per_s;
  j["lower_bound_s"] = p.lower_bound_s;
  j["bound"] = p.bound;
  j["exposed_comm_s"] = p.exposed_comm_s;
  j["overlapped_comm_s"] = p.overlapped_comm_s;
  j["device"] = write_pool(p.device);
  j["host"] = write_pool(p.host);
  j["model_states"] = write_model_states(p.model_states);
  j["resource_busy_s"] = p.resource_busy_s;
  j["units"] = write_array(p.units, write_unit_timing);
  if (!p.stages.empty()) {  // pipelined plans only
    j["stages"] = write_array(p.stages, write_stage_prediction);
    j["bubble_fraction"] = p.bubble_fraction;
  }
  j["trace_path"] = p.trace_path;
  j["notes"] = p.notes;
  j["plan"] = to_ordered_json(p.plan);
  return j;
}

void validate(const Prediction& p) {
  validate(p.plan);
  if (p.model.empty()) prediction_error("model is empty");
  if (p.cluster.empty()) prediction_error("cluster is empty");
  if (!(p.step_time_s > 0)) prediction_error("step_time_s must be > 0 (got " + num(p.step_time_s) + ")");
  check_non_negative("sync_step_time_s", p.sync_step_time_s);
  check_non_negative("lower_bound_s", p.lower_bound_s);
  if (p.lower_bound_s > p.step_time_s * (1 + 1e-9))
    prediction_error("lower_bound_s " + num(p.lower_bound_s) + " > step_time_s " + num(p.step_time_s));
  const double expected = p.plan.global_batch / p.step_time_s;
  if (!(std::fabs(p.samples_per_s - expected) <= 1e-9 * expected))
    prediction_error("samples_per_s " + num(p.samples_per_s) + " != global_batch " + num(p.plan.global_batch) +
                     " / step_time_s " + num(p.step_time_s) + " (= " + num(expected) + ")");
  if (p.bound != "compute" && p.bound != "communication" && p.bound != "copies" && p.bound != "host_optimizer")
    prediction_error("bound must be one of \"compute\", \"communication\", \"copies\", \"host_optimizer\" (got " +
                     quote_json(p.bound) + ")");
  check_non_negative("exposed_comm_s", p.exposed_comm_s);
  check_non_negative("overlapped_comm_s", p.overlapped_comm_s);
  check_pool("device", p.device);
  check_pool("host", p.host);
  const ModelStates& m = p.model_states;
  for (const auto& [field, v] : {std::pair{"device.params", m.device_params}, std::pair{"device.grads", m.device_grads},
                                 std::pair{"device.optimizer", m.device_optimizer}, std::pair{"host.params", m.host_params},
                                 std::pair{"host.grads", m.host_grads}, std::pair{"host.optimizer", m.host_optimizer}})
    if (v < 0) prediction_error(std::string("model_states.") + field + " must be >= 0 (got " + num(v) + ")");
  for (const auto& [resource, busy] : p.resource_busy_s) check_non_negative("resource_busy_s." + resource, busy);
  if (!(p.bubble_fraction >= 0 && p.bubble_fraction <= 1))
    prediction_error("bubble_fraction must be in [0, 1] (got " + num(p.bubble_fraction) + ")");
  for (std::size_t i = 0; i < p.stages.size(); ++i) {
    const StagePrediction& s = p.stages[i];
    const std::string at = "stages[" + std::to_string(i) + "]";
    if (s.units < 1) prediction_error(at + ".units must be >= 1 (got " + num(s.units) + ")");
    check_pool(at + ".device", s.device);
    check_non_negative(at + ".host_peak_bytes", s.host_peak_bytes);
    check_non_negative(at + ".compute_busy_s", s.compute_busy_s);
  }
  for (std::size_t i = 0; i < p.units.size(); ++i) {
    const UnitTiming& u = p.units[i];
    const std::string at = "units[" + std::to_string(i) + "]";
    check_non_negative(at + ".fwd_start_s", u.fwd_start_s);
    check_non_negative(at + ".fwd_s", u.fwd_s);
    check_non_negative(at + ".bwd_start_s", u.bwd_start_s);
    check_non_negative(at + ".bwd_s", u.bwd_s);
  }
}

void to_json(nlohmann::json& j, const Prediction& p) { j = to_plain(to_ordered_json(p)); }

void from_json(const nlohmann::json& j, Prediction& p) {
  ObjectReader r(j, kPredictionWhere);
  check_schema(r, kPredictionSchema);
  p = Prediction{};
  r.req("model", p.model);
  r.req("cluster", p.cluster);
  r.req("step_time_s", p.step_time_s);
  r.opt("sync_step_time_s", p.sync_step_time_s);
  if (!r.has("sync_step_time_s")) p.sync_step_time_s = p.step_time_s;
  r.req("samples_per_s", p.samples_per_s);
  r.req("lower_bound_s", p.lower_bound_s);
  r.req("bound", p.bound);
  r.req("exposed_comm_s", p.exposed_comm_s);
  r.req("overlapped_comm_s", p.overlapped_comm_s);
  r.req("device", p.device);
  r.req("host", p.host);
  r.opt("model_states", p.model_states);
  r.opt("resource_busy_s", p.resource_busy_s);
  r.opt("units", p.units);
  r.opt("stages", p.stages);
  r.opt("bubble_fraction", p.bubble_fraction);
  r.opt("trace_path", p.trace_path);
  r.opt("notes", p.notes);
  r.req("plan", p.plan);
  r.finish();
  validate(p);
}

}  // namespace zeroplan
