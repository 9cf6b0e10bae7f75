// Compressed rows: items grouped by key, in input order within a key. The engine's adjacency lists.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace zeroplan::sim::detail {

struct Csr {
  std::vector<std::uint32_t> offset;  // size keys + 1
  std::vector<std::uint32_t> items;

  std::span<const std::uint32_t> row(std::uint32_t key) const {
    return {items.data() + offset[key], items.data() + offset[key + 1]};
  }

  // key_of(i) and value_of(i) for i in [0, count); entries with key == skip_key are left out.
  template <class KeyOf, class ValueOf>
  static Csr build(std::uint32_t keys, std::uint32_t count, KeyOf key_of, ValueOf value_of,
                   std::uint32_t skip_key = UINT32_MAX) {
    Csr c;
    c.assign(keys, count, key_of, value_of, skip_key);
    return c;
  }

  // The same into this one, reusing its memory (the engine's per-thread workspace).
  template <class KeyOf, class ValueOf>
  void assign(std::uint32_t keys, std::uint32_t count, KeyOf key_of, ValueOf value_of,
              std::uint32_t skip_key = UINT32_MAX) {
    begin_count(keys);
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::uint32_t k = key_of(i);
      if (k != skip_key) count_one(k);
    }
    begin_place();
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::uint32_t k = key_of(i);
      if (k != skip_key) place(k, value_of(i));
    }
    end_place();
  }

  // In steps, to build several from one pass over the input: begin_count, count_one per item,
  // begin_place, place per item in the same order, end_place.
  void begin_count(std::uint32_t keys) { offset.assign(keys + 1, 0); }
  void count_one(std::uint32_t key) { ++offset[key + 1]; }
  void begin_place() {
    const std::size_t keys = offset.size() - 1;
    for (std::size_t k = 0; k < keys; ++k) offset[k + 1] += offset[k];
    items.resize(offset[keys]);
  }
  // Each row fills from its start, offset[k] moving to the row's end (the next row's start) ...
  void place(std::uint32_t key, std::uint32_t value) { items[offset[key]++] = value; }
  // ... and the starts shift back in place.
  void end_place() {
    for (std::size_t k = offset.size() - 1; k > 0; --k) offset[k] = offset[k - 1];
    offset[0] = 0;
  }
};

// The longest chain of a task graph whose every dependency is an earlier task (ids a topological order):
// in id order, each task finishes its duration(t) after the latest finish among its dependencies; the
// same maxima and sums as a critical path. `succ`: per task, the tasks waiting for it; `start`: scratch,
// per task the latest finish among its dependencies. graph.h's longest_chain_s and the engine's run.
template <class Duration>
double longest_chain_in_id_order(std::uint32_t tasks, const Csr& succ, Duration duration, std::vector<double>& start) {
  start.assign(tasks, 0.0);
  double longest = 0;
  for (std::uint32_t t = 0; t < tasks; ++t) {
    const double finish = start[t] + duration(t);
    longest = std::max(longest, finish);
    for (std::uint32_t k = succ.offset[t]; k < succ.offset[t + 1]; ++k) {
      double& s = start[succ.items[k]];
      s = std::max(s, finish);
    }
  }
  return longest;
}

}  // namespace zeroplan::sim::detail
