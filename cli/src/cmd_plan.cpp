// zeroplan plan --fields: the knob registry (every Plan knob, its range, default, and which of simulate,
// tune and run support it) as a table, or as JSON with --json.
#include <fmt/core.h>

#include <memory>

#include "cli.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan::cli {

Action add_plan(CLI::App& app, const Globals& globals) {
  auto fields = std::make_shared<bool>(false);
  app.add_flag("--fields", *fields, "Print every Plan knob: type, range, default, support by simulate / tune / run")
      ->required();
  return [fields, &globals] {
    if (globals.json) fmt::print("{}\n", knob_table_json().dump(2));
    else fmt::print("{}", knob_table_text());
    return kOk;
  };
}

}  // namespace zeroplan::cli
