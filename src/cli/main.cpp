// rill: the command line. `rill run | score | inspect | bench | serve | cache`.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "backend/cpu/gemm_kquant_amx.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"rill: a local-first LLM inference engine"};
  app.require_subcommand(1);
  const rill::cli::Command commands[] = {
      rill::cli::add_run_command(app),   rill::cli::add_score_command(app), rill::cli::add_inspect_command(app),
      rill::cli::add_bench_command(app), rill::cli::add_serve_command(app), rill::cli::add_cache_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; every usage error exits 2.
    return app.exit(e) == 0 ? 0 : 2;
  }
  // The CPU kernels' environment switches are read when the first forward
  // pass builds the kernel tables: a bad value is refused here, before a
  // model loads or a server listens.
  if (const auto err = rill::cpu::kquant_amx_env_error()) {
    std::fprintf(stderr, "rill: %s\n", err->c_str());
    return 2;
  }
  for (const auto& c : commands) {
    if (c.sub->parsed()) return c.run();
  }
  return 2;
}
