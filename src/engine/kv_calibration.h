#pragma once
// The text that q4a (k4a, model/kv_types.h) calibrates its per-channel K
// widths on (CpuPagedModel::calibrate_kv): a built-in one, or a file
// (--kv-calibration FILE). Measured (docs/perf.md, issue 22): 256 tokens of
// Python source allocate bits as well for licence text as licence text
// does, so one short mixed text of prose and code serves.
#include <string>
#include <string_view>

#include "core/result.h"
#include "model/kv_types.h"
#include "text/tokenizer.h"

namespace rill {

// At most this many bytes of a calibration file are read (the pass uses
// 256 tokens; a multi-byte character cut at the end is the tokenizer's to
// handle, as any text's).
inline constexpr size_t kMaxKvCalibrationBytes = 64 << 10;

// The built-in calibration text (prose and code, 472 tokens with
// SmolLM2's tokenizer). Changing it changes every q4a width, which the
// KV numerics then name (CpuPagedModel::kv_numerics' widths hash).
extern const std::string_view kKvCalibrationText;

inline constexpr size_t kMinKvCalibrationTokens = 64;
// When kv mentions q4a: sets kv.calibration_tokens to tok's tokens (BOS
// added as a prompt's) of the file kv.calibration_path, or of
// kKvCalibrationText when that is empty. Errors: no tokenizer; a file that cannot be read or
// holds fewer than kMinKvCalibrationTokens tokens (naming the file).
// Without q4a: nothing, Ok (the CLI refuses --kv-calibration then).
Status add_kv_calibration(const Tokenizer* tok, KvTypeOptions& kv);

}  // namespace rill
