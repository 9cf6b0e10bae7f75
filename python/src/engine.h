// zeroplan._C's training half (engine.cpp): the rank's session and the hook driver.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace zeroplan::python {
void bind_engine(pybind11::module_& m);
}  // namespace zeroplan::python
