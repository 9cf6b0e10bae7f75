// Compressed rows: items grouped by key, in input order within a key. The engine's adjacency lists.
#pragma once

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
    c.offset.assign(keys + 1, 0);
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::uint32_t k = key_of(i);
      if (k != skip_key) ++c.offset[k + 1];
    }
    for (std::uint32_t k = 0; k < keys; ++k) c.offset[k + 1] += c.offset[k];
    c.items.resize(c.offset[keys]);
    std::vector<std::uint32_t> fill(c.offset.begin(), c.offset.end() - 1);
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::uint32_t k = key_of(i);
      if (k != skip_key) c.items[fill[k]++] = value_of(i);
    }
    return c;
  }
};

}  // namespace zeroplan::sim::detail
