// The tune report as a list of blocks (report_blocks.h), rendered to Markdown and HTML from the same
// content.
#pragma once

#include <string>
#include <vector>

#include "zeroplan/tuner/report_blocks.h"
#include "zeroplan/tuner/tune.h"

namespace zeroplan::tuner::report {

std::vector<Block> build_document(const TuneResult& result);

// Plots ("pareto", "breakdown", "memory") as inline SVG.
std::string svg_pareto(const TuneResult& result);
std::string svg_breakdown(const TuneResult& result);
std::string svg_memory(const TuneResult& result);

}  // namespace zeroplan::tuner::report
