// The report as a list of blocks, rendered to Markdown (report_markdown.cpp) and HTML (report_html.cpp)
// from the same content.
#pragma once

#include <string>
#include <vector>

#include "zeroplan/tuner/tune.h"

namespace zeroplan::tuner::report {

struct Block {
  enum class Kind { heading, paragraph, list, table, code, plot };
  Kind kind = Kind::paragraph;
  int level = 2;                                 // heading
  std::string text;                              // heading, paragraph, code; plot: which plot
  std::vector<std::string> items;                // list
  std::vector<std::string> header;               // table
  std::vector<std::vector<std::string>> rows;    // table
};

// Text in blocks is plain (no markup); `code` spans are written as `...` and rendered by both.
std::vector<Block> build_document(const TuneResult& result);

// Plots ("pareto", "breakdown", "memory") as inline SVG.
std::string svg_pareto(const TuneResult& result);
std::string svg_breakdown(const TuneResult& result);
std::string svg_memory(const TuneResult& result);

}  // namespace zeroplan::tuner::report
