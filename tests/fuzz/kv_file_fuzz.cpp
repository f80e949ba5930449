// Fuzz target: parse_kv_header (KV file format v2, kv/kv_file.h) must never
// crash, hang or read outside its input on any bytes; malformed input is an
// Error. Two views of each input:
//  - as a whole file (and as the prefix of a larger file, the way
//    read_kv_header calls it);
//  - when it starts with '{', as the JSON header of a file whose framing
//    (magic, lengths, header hash) is made valid here, so mutations reach the
//    schema checks instead of stopping at the header hash.
// A header that parses must describe tensors inside the claimed file at
// aligned offsets; those inside the input are read and hashed (as --kv-verify
// does) so a bad bound shows up under AddressSanitizer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/hash.h"
#include "kv/kv_file.h"

namespace {

constexpr size_t kFixedBytes = 24;  // magic, header length, data start, header hash

void check(std::span<const uint8_t> prefix, uint64_t file_size) {
  auto header = rill::parse_kv_header(prefix, file_size, "fuzz.rkv");
  if (!header.ok()) return;
  volatile uint64_t sink = 0;
  for (const rill::KvLayerDesc& layer : header->layers) {
    for (const rill::KvTensorDesc& t : layer.tensors) {
      if (t.off % rill::kKvFileAlignment != 0 || t.off > file_size || t.bytes > file_size - t.off) std::abort();
      if (t.off <= prefix.size() && t.bytes <= prefix.size() - t.off) {
        sink = sink ^ rill::hash64(prefix.data() + t.off, static_cast<size_t>(t.bytes));
      }
    }
  }
  (void)rill::kv_identity_mismatch(rill::KvFileIdentity{}, header->identity);
}

void put_u32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}  // x86-64: little-endian
void put_u64(uint8_t* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  check(in, size);
  check(in, uint64_t{1} << 40);  // a prefix of a (claimed) 1 TiB file
  if (size > 0 && size < (1u << 20) && data[0] == '{') {
    // Framed as a header: the data start is the first aligned offset after it.
    const uint64_t data_start =
        (kFixedBytes + size + rill::kKvFileAlignment - 1) / rill::kKvFileAlignment * rill::kKvFileAlignment;
    std::vector<uint8_t> file(kFixedBytes + size);
    std::memcpy(file.data(), "RILLKV2\n", 8);
    put_u32(file.data() + 8, static_cast<uint32_t>(size));
    put_u32(file.data() + 12, static_cast<uint32_t>(data_start));
    put_u64(file.data() + 16, rill::hash64(data, size));
    std::memcpy(file.data() + kFixedBytes, data, size);
    check(file, data_start + 2 * rill::kKvFileAlignment);  // room for two tensors
    check(file, file.size());                              // no room for any
  }
  return 0;
}
