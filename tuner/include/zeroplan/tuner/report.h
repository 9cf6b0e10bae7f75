// Reports of a tune: tune.json (machine-readable, byte-identical for identical inputs), report.md,
// report.html (self-contained, inline SVG plots), and the winner's exports.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "zeroplan/tuner/tune.h"

namespace zeroplan::tuner {

inline constexpr const char* kTuneSchema = "zeroplan.tune/1";

// "zeroplan.tune/1": constraints, limits, counts, rejections, ranking, Pareto front, the default, the
// explanation and the exports' status. No wall time, no paths: identical inputs give identical text.
std::string tune_json(const TuneResult& result);

std::string report_markdown(const TuneResult& result);

// Self-contained HTML: the tables of report.md and three inline SVG plots (the Pareto front of device
// memory against samples/s, the time breakdown of the top plans, the winner's memory at the peak by
// category). No scripts, no external resources.
std::string report_html(const TuneResult& result);

// Writes report.md, report.html, tune.json, and for the winner plan.json, ds_config.json,
// accelerate_fsdp.yaml, accelerate_fsdp2.yaml, fairscale.py (an export the tool cannot express is written
// as <file>.unsupported.txt saying why) and export_notes.md. The files are written into a fresh sibling
// folder that then takes `folder`'s place, so a tune killed half-way leaves the previous one whole and
// two tunes' files never mix; a previous tune's folder is replaced, anything else refused (see
// check_report_folder). Returns the files written, in that order. Throws SchemaError ("FOLDER: cannot
// write: reason") on I/O failure.
std::vector<std::filesystem::path> write_reports(const TuneResult& result, const std::filesystem::path& folder);

// Before any work: `folder` may be written by write_reports when it does not exist, is an empty folder
// or holds a previous tune (a tune.json); otherwise SchemaError naming it and what is in the way.
void check_report_folder(const std::filesystem::path& folder);

}  // namespace zeroplan::tuner
