#include "zeroplan/profiles/model_profile.h"

#include <cmath>
#include <set>

#include "json_util.h"

namespace zeroplan {

namespace {

constexpr const char* kModelWhere = "model_profile";

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

namespace {

[[noreturn]] void model_error(const std::string& message) { fail(kModelWhere, message); }

// Bounds that keep every sum the simulator makes finite and every count in range: a figure (bytes,
// seconds, FLOPs per unit) at most 1e18, a unit repeated at most 1e6 times, at most 1e6 units expanded,
// at most 1e12 parameters per unit.
constexpr double kMaxFigure = 1e18;
constexpr std::int64_t kMaxCount = 1000000, kMaxUnitParams = 1000000000000;

void check_figure(const std::string& where, const Figure& f) {
  if (!(f.value >= 0)) model_error(where + " must be >= 0 (got " + num(f.value) + ")");
  for (const double v : {f.value, f.fit.intercept, f.fit.per_sample}) {
    if (!(std::abs(v) <= kMaxFigure)) model_error(where + " must be finite and at most 1e18 in size (got " + num(v) + ")");
  }
  if (f.fit.points < 0) model_error(where + ".points must be >= 0 (got " + num(f.fit.points) + ")");
  if (!(f.fit.r2 <= 1)) model_error(where + ".r2 must be <= 1 (got " + num(f.fit.r2) + ")");
  for (std::size_t i = 0; i < f.measured.size(); ++i) {
    const auto& m = f.measured[i];
    if (!(m[0] > 0) || !(m[1] <= kMaxFigure) || m[1] < 0) {
      model_error(where + ".measured[" + num(static_cast<double>(i)) + "] must be a batch > 0 and a value >= 0 (got " +
                  num(m[0]) + ", " + num(m[1]) + ")");
    }
    if (i > 0 && !(m[0] > f.measured[i - 1][0])) {
      model_error(where + ".measured batches must increase (got " + num(f.measured[i - 1][0]) + " then " + num(m[0]) + ")");
    }
  }
}

}  // namespace

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

void validate(const ModelProfile& m) {
  if (m.name.empty()) model_error("name is empty");
  if (m.source.empty()) model_error("source is empty");
  if (m.dtype != "fp32" && m.dtype != "fp16" && m.dtype != "bf16")
    model_error("dtype must be \"fp32\", \"fp16\" or \"bf16\" (got " + quote_json(m.dtype) + ")");
  if (m.threads < 1) model_error("threads must be >= 1 (got " + num(m.threads) + ")");
  if (m.concurrent_ranks < 1 || m.concurrent_ranks > 4096)
    model_error("concurrent_ranks must be in 1..4096 (got " + num(m.concurrent_ranks) + ")");
  if (!(m.rank_skew >= 0 && m.rank_skew <= 1)) model_error("rank_skew must be in [0, 1] (got " + num(m.rank_skew) + ")");
  if (m.batch < 1) model_error("batch must be >= 1 (got " + num(m.batch) + ")");
  if (m.seq_len < 0) model_error("seq_len must be >= 0 (got " + num(m.seq_len) + ")");
  if (m.image_size < 0) model_error("image_size must be >= 0 (got " + num(m.image_size) + ")");
  for (std::size_t i = 0; i < m.profiled_batches.size(); ++i) {
    if (m.profiled_batches[i] < 1)
      model_error("profiled_batches[" + num(static_cast<std::int64_t>(i)) + "] must be >= 1 (got " +
                  num(m.profiled_batches[i]) + ")");
    if (i > 0 && m.profiled_batches[i] <= m.profiled_batches[i - 1])
      model_error("profiled_batches must be increasing (" + num(m.profiled_batches[i - 1]) + " then " +
                  num(m.profiled_batches[i]) + ")");
  }
  if (m.units.empty()) model_error("no units");
  std::set<std::string> names;
  std::int64_t expanded = 0;
  for (std::size_t i = 0; i < m.units.size(); ++i) {
    const UnitProfile& u = m.units[i];
    const std::string where = "units[" + std::to_string(i) + "]";
    if (u.name.empty()) model_error(where + ".name is empty");
    if (!names.insert(u.name).second) model_error(where + ".name " + quote_json(u.name) + " is not unique");
    const std::string at = where + " (" + u.name + ")";
    if (u.type.empty()) model_error(at + ".type is empty");
    if (u.count < 1) model_error(at + ".count must be >= 1 (got " + num(u.count) + ")");
    if (u.count > kMaxCount) model_error(at + ".count must be at most 1000000 (got " + num(u.count) + ")");
    expanded += u.count;
    if (expanded > kMaxCount) model_error(at + ": more than 1000000 units in all (with the counts so far: " + num(expanded) + ")");
    if (u.params < 0) model_error(at + ".params must be >= 0 (got " + num(u.params) + ")");
    if (u.params > kMaxUnitParams) model_error(at + ".params must be at most 1e12 (got " + num(u.params) + ")");
    if (u.bytes_param < 0) model_error(at + ".bytes_param must be >= 0 (got " + num(u.bytes_param) + ")");
    if (u.params > 0 && u.bytes_param == 0)
      model_error(at + ".bytes_param is 0 but params is " + num(u.params));
    if (u.bytes_buffer < 0) model_error(at + ".bytes_buffer must be >= 0 (got " + num(u.bytes_buffer) + ")");
    check_figure(at + ".bytes_saved", u.bytes_saved);
    check_figure(at + ".bytes_output", u.bytes_output);
    check_figure(at + ".time_fwd_s", u.time_fwd_s);
    check_figure(at + ".time_bwd_s", u.time_bwd_s);
    check_figure(at + ".time_fwd_spread_s", u.time_fwd_spread_s);
    check_figure(at + ".time_bwd_spread_s", u.time_bwd_spread_s);
    check_figure(at + ".kernel_time_fwd_s", u.kernel_time_fwd_s);
    check_figure(at + ".kernel_time_bwd_s", u.kernel_time_bwd_s);
    check_figure(at + ".bytes_peak_fwd", u.bytes_peak_fwd);
    check_figure(at + ".bytes_peak_bwd", u.bytes_peak_bwd);
    check_figure(at + ".bytes_peak_fwd_without_loss", u.bytes_peak_fwd_without_loss);
    check_figure(at + ".time_loss_s", u.time_loss_s);
    check_figure(at + ".flops_fwd", u.flops_fwd);
    check_figure(at + ".flops_bwd", u.flops_bwd);
    for (const auto& [dtype, d] : u.times_at_dtype) {
      if (dtype != "fp32" && dtype != "fp16" && dtype != "bf16")
        model_error(at + ".times_at_dtype: \"" + dtype + "\" is not one of fp32, fp16, bf16");
      check_figure(at + ".times_at_dtype." + dtype + ".time_fwd_s", d.time_fwd_s);
      check_figure(at + ".times_at_dtype." + dtype + ".time_bwd_s", d.time_bwd_s);
    }
    for (std::size_t k = 0; k < u.ops.size(); ++k) {
      const UnitOp& o = u.ops[k];
      const std::string ow = at + ".ops[" + std::to_string(k) + "]";
      if (o.kind != "gemm" && o.kind != "attention" && o.kind != "memory")
        model_error(ow + ".kind must be \"gemm\", \"attention\" or \"memory\" (got " + quote_json(o.kind) + ")");
      if (o.kind == "memory") {
        if (!(o.elems_fwd >= 0 && o.elems_bwd >= 0 && o.bytes_fwd >= 0 && o.bytes_bwd >= 0 && std::isfinite(o.elems_fwd) &&
              std::isfinite(o.elems_bwd) && std::isfinite(o.bytes_fwd) && std::isfinite(o.bytes_bwd)))
          model_error(ow + " (" + o.name + "): elems and bytes must be finite and >= 0 (got " + num(o.elems_fwd) + ", " +
                      num(o.elems_bwd) + ", " + num(o.bytes_fwd) + ", " + num(o.bytes_bwd) + ")");
        if (o.kernels_fwd < 0 || o.kernels_bwd < 0)
          model_error(ow + " (" + o.name + "): kernels must be >= 0 (got " + num(o.kernels_fwd) + ", " + num(o.kernels_bwd) + ")");
      } else if (o.m < 1 || o.n < 1 || o.k < 1 || o.batch < 1) {
        model_error(ow + " (" + o.name + "): m, n, k and batch must be >= 1 (got " + num(o.m) + ", " + num(o.n) + ", " +
                    num(o.k) + ", " + num(o.batch) + ")");
      }
    }
    double saved_sum = 0;
    for (std::size_t k = 0; k < u.saved_tensors.size(); ++k) {
      const auto b = static_cast<double>(u.saved_tensors[k]);
      if (!(b >= 1 && b <= kMaxFigure))
        model_error(at + ".saved_tensors[" + std::to_string(k) + "] must be in [1, 1e18] bytes (got " + num(b) + ")");
      saved_sum += b;
    }
    if (saved_sum > u.bytes_saved.value * (1 + 1e-9) + 1)
      model_error(at + ".saved_tensors sum to " + num(saved_sum) + " bytes, more than bytes_saved " + num(u.bytes_saved.value));
    for (std::size_t k = 0; k < u.borrowed.size(); ++k) {
      const BorrowedParams& b = u.borrowed[k];
      const std::string bw = at + ".borrowed[" + std::to_string(k) + "]";
      if (b.unit < 0 || static_cast<std::size_t>(b.unit) >= i)
        model_error(bw + ".unit " + num(b.unit) + " is not an earlier unit (0.." + num(static_cast<std::int64_t>(i) - 1) + ")");
      const UnitProfile& owner = m.units[static_cast<std::size_t>(b.unit)];
      if (owner.count != 1)
        model_error(bw + ".unit " + num(b.unit) + " (" + owner.name + ") has count " + num(owner.count) + "; an owner must have count 1");
      if (b.params < 1 || b.params > owner.params)
        model_error(bw + ".params " + num(b.params) + " is not in 1.." + num(owner.params) + " (the parameters of " + owner.name + ")");
    }
  }
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
