#pragma once
// The rill subcommands. Each registers its options on the CLI11 app and
// returns the process exit code when run.
#include <CLI/CLI.hpp>

#include <functional>

namespace rill::cli {

struct Command {
  CLI::App* sub = nullptr;   // the parsed subcommand
  std::function<int()> run;  // returns the exit code
};

Command add_run_command(CLI::App& app);
Command add_score_command(CLI::App& app);
Command add_inspect_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_cache_command(CLI::App& app);

}  // namespace rill::cli
