// The ModelProfile's rules: every count and figure in range (bounds that keep the simulator's sums
// finite), units and their borrowed weights consistent.
#include <cmath>
#include <set>

#include "model_profile_internal.h"
#include "zeroplan/profiles/model_profile.h"

namespace zeroplan {
namespace {

using detail::model_error;


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

void validate(const ModelProfile& m) {
  if (m.name.empty()) model_error("name is empty");
  if (m.source.empty()) model_error("source is empty");
  if (m.dtype != "fp32" && m.dtype != "fp16" && m.dtype != "bf16")
    model_error("dtype must be \"fp32\", \"fp16\" or \"bf16\" (got " + quote_json(m.dtype) + ")");
  if (m.threads < 1) model_error("threads must be >= 1 (got " + num(m.threads) + ")");
  if (m.concurrent_ranks < 1 || m.concurrent_ranks > 4096)
    model_error("concurrent_ranks must be in 1..4096 (got " + num(m.concurrent_ranks) + ")");
  if (!(m.rank_skew >= 0 && m.rank_skew <= 1)) model_error("rank_skew must be in [0, 1] (got " + num(m.rank_skew) + ")");
  if (m.device_library_bytes < 0)
    model_error("device_library_bytes must be >= 0 (got " + num(m.device_library_bytes) + ")");
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
    check_figure(at + ".bytes_peak_bwd_in_place", u.bytes_peak_bwd_in_place);
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
    for (std::size_t k = 0; k < u.bwd_unpack_order.size(); ++k) {
      const std::int64_t p = u.bwd_unpack_order[k];
      if (p < 0 || static_cast<std::size_t>(p) >= u.saved_tensors.size())
        model_error(at + ".bwd_unpack_order[" + std::to_string(k) + "] must name one of the " +
                    std::to_string(u.saved_tensors.size()) + " saved_tensors (got " + std::to_string(p) + ")");
    }
    for (const auto* peaks : {&u.bwd_unpack_peaks, &u.bwd_unpack_peaks_in_place}) {
      if (!peaks->empty() && peaks->size() != u.bwd_unpack_order.size() + 1)
        model_error(at + (peaks == &u.bwd_unpack_peaks ? ".bwd_unpack_peaks" : ".bwd_unpack_peaks_in_place") +
                    " must have one more entry than bwd_unpack_order's " + std::to_string(u.bwd_unpack_order.size()) +
                    " (got " + std::to_string(peaks->size()) + ")");
    }
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

}  // namespace zeroplan
