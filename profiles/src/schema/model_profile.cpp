#include "zeroplan/profiles/model_profile.h"

#include <cmath>
#include <set>

#include "json_util.h"
#include "model_profile_internal.h"

namespace zeroplan {

using detail::kModelWhere;
using detail::model_error;

namespace {

ojson write_figure(const Figure& f) {
  ojson j;
  j["value"] = f.value;
  j["intercept"] = f.fit.intercept;
  j["per_sample"] = f.fit.per_sample;
  j["r2"] = f.fit.r2;
  j["points"] = f.fit.points;
  if (!f.measured.empty()) j["measured"] = f.measured;
  return j;
}

ojson write_op(const UnitOp& o) {
  ojson j;
  j["kind"] = o.kind;
  j["name"] = o.name;
  if (o.kind == "memory") {
    j["elems_fwd"] = o.elems_fwd;
    j["elems_bwd"] = o.elems_bwd;
    j["bytes_fwd"] = o.bytes_fwd;
    j["bytes_bwd"] = o.bytes_bwd;
    j["kernels_fwd"] = o.kernels_fwd;
    j["kernels_bwd"] = o.kernels_bwd;
    return j;
  }
  j["m"] = o.m;
  j["n"] = o.n;
  j["k"] = o.k;
  j["batch"] = o.batch;
  if (o.kind == "gemm") {
    j["bias"] = o.bias;
  } else {
    j["fused"] = o.fused;
    j["causal"] = o.causal;
    j["dropout"] = o.dropout;
  }
  return j;
}

ojson write_unit_profile(const UnitProfile& u) {
  ojson j;
  j["name"] = u.name;
  j["type"] = u.type;
  j["count"] = u.count;
  j["params"] = u.params;
  j["bytes_param"] = u.bytes_param;
  j["bytes_buffer"] = u.bytes_buffer;
  j["input_shape"] = u.input_shape;
  j["output_shape"] = u.output_shape;
  j["bytes_saved"] = write_figure(u.bytes_saved);
  j["bytes_output"] = write_figure(u.bytes_output);
  j["time_fwd_s"] = write_figure(u.time_fwd_s);
  j["time_bwd_s"] = write_figure(u.time_bwd_s);
  j["time_fwd_spread_s"] = write_figure(u.time_fwd_spread_s);
  j["time_bwd_spread_s"] = write_figure(u.time_bwd_spread_s);
  j["bytes_peak_fwd"] = write_figure(u.bytes_peak_fwd);
  j["bytes_peak_bwd"] = write_figure(u.bytes_peak_bwd);
  if (u.bytes_peak_bwd_in_place.value > 0) j["bytes_peak_bwd_in_place"] = write_figure(u.bytes_peak_bwd_in_place);
  if (u.bytes_peak_fwd_without_loss.value > 0) j["bytes_peak_fwd_without_loss"] = write_figure(u.bytes_peak_fwd_without_loss);
  if (u.time_loss_s.value > 0) j["time_loss_s"] = write_figure(u.time_loss_s);
  j["flops_fwd"] = write_figure(u.flops_fwd);
  j["flops_bwd"] = write_figure(u.flops_bwd);
  if (u.kernel_time_fwd_s.value > 0) j["kernel_time_fwd_s"] = write_figure(u.kernel_time_fwd_s);
  if (u.kernel_time_bwd_s.value > 0) j["kernel_time_bwd_s"] = write_figure(u.kernel_time_bwd_s);
  if (!u.times_at_dtype.empty()) {
    ojson t = ojson::object();
    for (const auto& [dtype, d] : u.times_at_dtype)
      t[dtype] = ojson{{"time_fwd_s", write_figure(d.time_fwd_s)}, {"time_bwd_s", write_figure(d.time_bwd_s)}};
    j["times_at_dtype"] = t;
  }
  if (!u.borrowed.empty()) {
    j["borrowed"] = ojson::array();
    for (const BorrowedParams& b : u.borrowed) {
      ojson e;
      e["unit"] = b.unit;
      e["params"] = b.params;
      j["borrowed"].push_back(e);
    }
  }
  if (!u.ops.empty()) j["ops"] = write_array(u.ops, write_op);
  if (!u.saved_tensors.empty()) j["saved_tensors"] = u.saved_tensors;
  if (!u.bwd_unpack_order.empty()) j["bwd_unpack_order"] = u.bwd_unpack_order;
  if (!u.bwd_unpack_peaks.empty()) j["bwd_unpack_peaks"] = u.bwd_unpack_peaks;
  if (!u.bwd_unpack_peaks_in_place.empty()) j["bwd_unpack_peaks_in_place"] = u.bwd_unpack_peaks_in_place;
  if (!u.recomputable) j["recomputable"] = false;
  return j;
}

}  // namespace

ojson to_ordered_json(const ModelProfile& m) {
  ojson j;
  j["schema"] = kModelProfileSchema;
  j["name"] = m.name;
  j["source"] = m.source;
  j["measured"] = m.measured;
  j["device"] = m.device;
  j["dtype"] = m.dtype;
  j["threads"] = m.threads;
  if (m.concurrent_ranks != 1) j["concurrent_ranks"] = m.concurrent_ranks;
  if (m.backward_adds_grads) j["backward_adds_grads"] = true;
  if (m.rank_skew > 0) j["rank_skew"] = m.rank_skew;
  if (m.device_library_bytes > 0) j["device_library_bytes"] = m.device_library_bytes;
  j["library_versions"] = m.library_versions;
  j["batch"] = m.batch;
  j["seq_len"] = m.seq_len;
  j["image_size"] = m.image_size;
  j["input_shape"] = m.input_shape;
  j["profiled_batches"] = m.profiled_batches;
  if (!m.notes.empty()) j["notes"] = m.notes;
  j["units"] = write_array(m.units, write_unit_profile);
  return j;
}


void read_value(const nlohmann::json& j, Figure& f, const std::string& path) {
  ObjectReader r(j, path);
  r.req("value", f.value);
  f.fit = Fit{f.value, 0, 1, 0};
  r.opt("intercept", f.fit.intercept);
  r.opt("per_sample", f.fit.per_sample);
  r.opt("r2", f.fit.r2);
  r.opt("points", f.fit.points);
  r.opt("measured", f.measured);
  r.finish();
}

void read_value(const nlohmann::json& j, BorrowedParams& b, const std::string& path) {
  ObjectReader r(j, path);
  r.req("unit", b.unit);
  r.req("params", b.params);
  r.finish();
}

void read_value(const nlohmann::json& j, UnitOp& o, const std::string& path) {
  ObjectReader r(j, path);
  r.req("kind", o.kind);
  r.req("name", o.name);
  r.opt("m", o.m);
  r.opt("n", o.n);
  r.opt("k", o.k);
  r.opt("batch", o.batch);
  r.opt("bias", o.bias);
  r.opt("fused", o.fused);
  r.opt("causal", o.causal);
  r.opt("dropout", o.dropout);
  r.opt("elems_fwd", o.elems_fwd);
  r.opt("elems_bwd", o.elems_bwd);
  r.opt("bytes_fwd", o.bytes_fwd);
  r.opt("bytes_bwd", o.bytes_bwd);
  r.opt("kernels_fwd", o.kernels_fwd);
  r.opt("kernels_bwd", o.kernels_bwd);
  r.finish();
}

void read_value(const nlohmann::json& j, DtypeTimes& d, const std::string& path) {
  ObjectReader r(j, path);
  r.req("time_fwd_s", d.time_fwd_s);
  r.req("time_bwd_s", d.time_bwd_s);
  r.finish();
}

void read_value(const nlohmann::json& j, UnitProfile& u, const std::string& path) {
  ObjectReader r(j, path);
  r.req("name", u.name);
  r.req("type", u.type);
  r.opt("count", u.count);
  r.req("params", u.params);
  r.req("bytes_param", u.bytes_param);
  r.opt("bytes_buffer", u.bytes_buffer);
  r.req("input_shape", u.input_shape);
  r.req("output_shape", u.output_shape);
  r.req("bytes_saved", u.bytes_saved);
  r.req("bytes_output", u.bytes_output);
  r.req("time_fwd_s", u.time_fwd_s);
  r.req("time_bwd_s", u.time_bwd_s);
  r.opt("time_fwd_spread_s", u.time_fwd_spread_s);
  r.opt("time_bwd_spread_s", u.time_bwd_spread_s);
  r.req("bytes_peak_fwd", u.bytes_peak_fwd);
  r.req("bytes_peak_bwd", u.bytes_peak_bwd);
  r.opt("bytes_peak_bwd_in_place", u.bytes_peak_bwd_in_place);
  r.opt("bytes_peak_fwd_without_loss", u.bytes_peak_fwd_without_loss);
  r.opt("time_loss_s", u.time_loss_s);
  r.req("flops_fwd", u.flops_fwd);
  r.req("flops_bwd", u.flops_bwd);
  r.opt("kernel_time_fwd_s", u.kernel_time_fwd_s);
  r.opt("kernel_time_bwd_s", u.kernel_time_bwd_s);
  r.opt("borrowed", u.borrowed);
  r.opt("times_at_dtype", u.times_at_dtype);
  r.opt("ops", u.ops);
  r.opt("saved_tensors", u.saved_tensors);
  r.opt("bwd_unpack_order", u.bwd_unpack_order);
  r.opt("bwd_unpack_peaks", u.bwd_unpack_peaks);
  r.opt("bwd_unpack_peaks_in_place", u.bwd_unpack_peaks_in_place);
  r.opt("recomputable", u.recomputable);
  r.finish();
}

void add_times_at_dtype(ModelProfile& profile, const ModelProfile& other) {
  const std::string where = "times at " + other.dtype + ": ";
  if (other.dtype == profile.dtype) model_error(where + "the profile is already at " + profile.dtype);
  if (other.units.size() != profile.units.size())
    model_error(where + num(static_cast<std::int64_t>(other.units.size())) + " units, the profile has " +
                num(static_cast<std::int64_t>(profile.units.size())));
  if (other.device != profile.device || other.threads != profile.threads ||
      other.concurrent_ranks != profile.concurrent_ranks || other.batch != profile.batch)
    model_error(where + "measured on " + other.device + " with " + num(other.threads) + " thread(s), " +
                num(other.concurrent_ranks) + " concurrent rank(s), batch " + num(other.batch) + "; the profile on " +
                profile.device + " with " + num(profile.threads) + ", " + num(profile.concurrent_ranks) + ", batch " +
                num(profile.batch));
  for (std::size_t i = 0; i < other.units.size(); ++i) {
    UnitProfile& u = profile.units[i];
    const UnitProfile& o = other.units[i];
    if (o.name != u.name || o.count != u.count)
      model_error(where + "unit " + num(static_cast<std::int64_t>(i)) + " is " + o.name + " x" + num(o.count) +
                  ", the profile's " + u.name + " x" + num(u.count));
    u.times_at_dtype[other.dtype] = DtypeTimes{o.time_fwd_s, o.time_bwd_s};
  }
}

std::int64_t ModelProfile::total_params() const {
  std::int64_t total = 0;
  for (const UnitProfile& u : units) total += u.params * u.count;
  return total;
}

std::int64_t ModelProfile::total_bytes_param() const {
  std::int64_t total = 0;
  for (const UnitProfile& u : units) total += u.bytes_param * u.count;
  return total;
}

int ModelProfile::expanded_unit_count() const {
  int total = 0;
  for (const UnitProfile& u : units) total += u.count;
  return total;
}

double ModelProfile::total_compute_time_s(double micro_batch) const {
  double total = 0;
  for (const UnitProfile& u : units)
    total += (u.time_fwd_s.at(micro_batch, batch) + u.time_bwd_s.at(micro_batch, batch)) * u.count;
  return total;
}

void to_json(nlohmann::json& j, const Figure& f) { j = to_plain(write_figure(f)); }
void to_json(nlohmann::json& j, const UnitProfile& u) { j = to_plain(write_unit_profile(u)); }
void to_json(nlohmann::json& j, const ModelProfile& m) { j = to_plain(to_ordered_json(m)); }

void from_json(const nlohmann::json& j, ModelProfile& m) {
  ObjectReader r(j, kModelWhere);
  check_schema(r, kModelProfileSchema);
  m = ModelProfile{};
  r.req("name", m.name);
  r.req("source", m.source);
  r.req("measured", m.measured);
  r.req("device", m.device);
  r.req("dtype", m.dtype);
  r.req("threads", m.threads);
  r.opt("concurrent_ranks", m.concurrent_ranks);
  r.opt("backward_adds_grads", m.backward_adds_grads);
  r.opt("rank_skew", m.rank_skew);
  r.opt("device_library_bytes", m.device_library_bytes);
  r.opt("library_versions", m.library_versions);
  r.req("batch", m.batch);
  r.opt("seq_len", m.seq_len);
  r.opt("image_size", m.image_size);
  r.req("input_shape", m.input_shape);
  r.opt("profiled_batches", m.profiled_batches);
  r.opt("notes", m.notes);
  r.req("units", m.units);
  r.finish();
  validate(m);
}

}  // namespace zeroplan
