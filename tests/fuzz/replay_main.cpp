// Replays a fuzz target's seed corpus plus deterministic mutations of each
// seed (bit flips, truncations, byte overwrites), so every build checks the
// parsers against malformed input even without clang/libFuzzer.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [MUTATIONS_PER_SEED]\n", argv[0]);
    return 2;
  }
  const int n_mutations = argc > 2 ? std::atoi(argv[2]) : 300;
  std::vector<std::vector<uint8_t>> seeds;
  if (std::filesystem::is_directory(argv[1])) {
    for (const auto& entry : std::filesystem::directory_iterator(argv[1])) {
      std::ifstream in(entry.path(), std::ios::binary);
      seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  seeds.push_back({});
  std::mt19937_64 rng(12345);
  size_t n_runs = 0;
  for (const auto& seed : seeds) {
    LLVMFuzzerTestOneInput(seed.data(), seed.size());
    ++n_runs;
    if (seed.empty()) continue;
    for (int m = 0; m < n_mutations; ++m) {
      std::vector<uint8_t> buf = seed;
      switch (m % 4) {
        case 0:
          buf.resize(rng() % buf.size());
          break;  // truncate
        case 1:
          buf[rng() % buf.size()] ^= uint8_t(1u << (rng() % 8));
          break;  // flip a bit
        case 2:   // overwrite bytes
          for (int k = 0; k < 4; ++k) buf[rng() % buf.size()] = uint8_t(rng());
          break;
        case 3: {  // write a large int
          size_t at = rng() % buf.size();
          for (size_t k = 0; k < 8 && at + k < buf.size(); ++k) buf[at + k] = k < 4 ? 0xff : 0x7f;
          break;
        }
      }
      LLVMFuzzerTestOneInput(buf.data(), buf.size());
      ++n_runs;
    }
  }
  std::printf("replayed %zu inputs from %zu seeds\n", n_runs, seeds.size() - 1);
  return 0;
}
