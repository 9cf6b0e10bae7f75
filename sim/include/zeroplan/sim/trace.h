// Chrome trace-event JSON of a simulated step: one tid per resource ("ph":"X" spans), one counter track
// per memory pool ("ph":"C"), ts and dur in microseconds. Formatting is fixed, so the same graph and
// result give byte-identical text. Opens in Perfetto and chrome://tracing.
#pragma once

#include <string>

#include "zeroplan/sim/engine.h"
#include "zeroplan/sim/task_graph.h"

namespace zeroplan::sim {

struct TraceOptions {
  int pid = 0;
  std::string process_name = "zeroplan simulate";
};

std::string chrome_trace_json(const TaskGraph& graph, const SimResult& result, const TraceOptions& options = {});

}  // namespace zeroplan::sim
