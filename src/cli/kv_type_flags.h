#pragma once
// --kv-type, --kv-type-k, --kv-type-v and --kv-config (model/kv_types.h),
// shared by rill serve, run, score and bench.
#include <CLI/CLI.hpp>

#include <string>

#include "core/e4m3.h"
#include "core/result.h"
#include "model/kv_types.h"

namespace rill::cli {

struct KvTypeFlags {
  std::string both, k, v, config, calibration;

  void add_to(CLI::App* app) {
    const std::string names =
        " (" + kv_type_names() +
        "; q4_0h / q8_0h / iq4_nlh: q4_0 / q8_0 / iq4_nl of Hadamard-rotated heads; q8_0h64: q8_0h in blocks of 64 "
        "(head_dim a multiple of 64); iq4_nlh64: iq4_nlh in blocks of 64 with an e4m3 scale; k4c: K per channel "
        "over 32 tokens; k4a: k4c with each K channel's width (0..8 bits, 4 on average) calibrated at load; k4c "
        "and k4a: the Llama and Gemma families)";
    app->add_option("--kv-type", both, "KV cache type of K and V in every layer" + names);
    app->add_option("--kv-type-k", k, "KV cache type of K (overrides --kv-type)" + names);
    app->add_option("--kv-type-v", v, "KV cache type of V (overrides --kv-type)" + names);
    app->add_option("--kv-config", config,
                    "file of per-layer KV types, one 'LAYER TYPE' or 'LAYER k=TYPE v=TYPE' per line (LAYER: N, "
                    "N-M, or -N from the end); overrides the flags for those layers");
    app->add_option("--kv-calibration", calibration,
                    "q4a (k4a): the text file its K widths are calibrated on at load (up to its first 256 tokens, "
                    "of its first 64 KiB; default: a built-in text of prose and code); refused without q4a");
  }

  // The options these flags give; errors name the flag or the file and line.
  Result<KvTypeOptions> value() const {
    KvTypeOptions o;
    auto parse = [](const std::string& flag, const std::string& s, std::optional<KvType>& out) -> Status {
      if (s.empty()) return {};
      out = parse_kv_type(s);
      if (!out) return Error{flag + ": unknown KV type '" + s + "' (one of " + kv_type_names() + ")"};
      return {};
    };
    if (!both.empty()) {
      const std::optional<KvLayerTypes> pair = parse_kv_pair(both);
      if (!pair) return Error{"--kv-type: unknown KV type '" + both + "' (one of " + kv_type_names() + ")"};
      o.k = pair->k;
      o.v = pair->v;
    }
    RILL_TRY(parse("--kv-type-k", k, o.k));
    RILL_TRY(parse("--kv-type-v", v, o.v));
    if (!config.empty()) RILL_TRY(load_kv_config(config, o));
    if (!calibration.empty() && !o.mentions(kKvQ4Alloc)) {
      return Error{"--kv-calibration " + calibration +
                   ": only KV type q4a (pair k4a) calibrates, and none is configured (--kv-type k4a)"};
    }
    o.calibration_path = calibration;
    return o;
  }
};

}  // namespace rill::cli
