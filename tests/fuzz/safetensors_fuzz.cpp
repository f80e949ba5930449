// Fuzz target: safetensors headers and shard indexes. Any input must give a
// value or an Error, never a crash; every tensor a successful parse returns
// must lie inside the input (read here so ASan checks it).
#include <cstddef>
#include <cstdint>
#include <string>

#include "loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tensors = rill::parse_safetensors(data, size, "fuzz.safetensors");
  if (tensors.ok()) {
    volatile uint8_t sink = 0;
    for (const auto& t : tensors.value()) {
      if (t.n_bytes == 0) continue;
      sink = sink ^ t.data[0] ^ t.data[t.n_bytes - 1];
    }
  }
  auto index = rill::parse_safetensors_index(std::string(reinterpret_cast<const char*>(data), size), "fuzz.index.json");
  (void)index.ok();
  return 0;
}
