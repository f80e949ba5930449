#include "text/unicode.h"

#include <cstdlib>

#include <utf8proc.h>

namespace rill::text {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Well-formed sequences (Unicode Table 3-7): the lead byte fixes the length
// and the allowed range of the second byte; later bytes are 80..BF.
Utf8Probe probe_utf8(std::string_view s) {
  Utf8Probe p;
  if (s.empty()) return p;
  const uint8_t b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) return {1, true, b0};
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  uint32_t cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return p;  // 80..C1, F5..FF never start a character
  }
  size_t n = 1;
  for (; n < need && n < s.size(); ++n) {
    const uint8_t b = static_cast<uint8_t>(s[n]);
    const uint8_t l = n == 1 ? lo : 0x80, h = n == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
    cp = (cp << 6) | (b & 0x3F);
  }
  p.valid_prefix_len = n;
  p.complete = n == need;
  p.cp = p.complete ? cp : 0;
  return p;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Probe p = probe_utf8(s.substr(i));
    if (!p.complete) return false;
    i += p.valid_prefix_len;
  }
  return true;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<uint8_t>(bytes[i]) < 0x80) {
      out.push_back(bytes[i++]);
      continue;
    }
    const Utf8Probe p = probe_utf8(bytes.substr(i));
    if (p.complete) {
      out.append(bytes.substr(i, p.valid_prefix_len));
      i += p.valid_prefix_len;
    } else {
      out.append(kReplacementUtf8);
      i += p.valid_prefix_len == 0 ? 1 : p.valid_prefix_len;
    }
  }
  return out;
}

void Utf8Stream::push(std::string_view bytes, std::string& out) {
  for (char c : bytes) {
    if (n_pending_ == 0 && static_cast<uint8_t>(c) < 0x80) {
      out.push_back(c);
      continue;
    }
    pending_[n_pending_++] = c;
    Utf8Probe p = probe_utf8(std::string_view(pending_, n_pending_));
    if (p.complete) {
      out.append(pending_, n_pending_);
      n_pending_ = 0;
    } else if (p.valid_prefix_len == n_pending_) {
      continue;  // still a valid, incomplete prefix
    } else {
      // `c` broke the sequence: the held prefix is one ill-formed subpart
      // (or `c` alone is, when nothing was held); then `c` starts afresh.
      out.append(kReplacementUtf8);
      const bool c_was_alone = n_pending_ == 1;
      n_pending_ = 0;
      if (!c_was_alone) push(std::string_view(&c, 1), out);
    }
  }
}

void Utf8Stream::finish(std::string& out) {
  if (n_pending_ > 0) out.append(kReplacementUtf8);
  n_pending_ = 0;
}

namespace {

struct ByteLevelTables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // code points < 324 cover the alphabet

  ByteLevelTables() {
    to_byte.fill(-1);
    uint32_t n_extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? b : 256 + n_extra++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_unicode() {
  return byte_level_tables().to_cp;
}

int unicode_to_byte(uint32_t cp) {
  const auto& t = byte_level_tables();
  return cp < t.to_byte.size() ? t.to_byte[cp] : -1;
}

void append_byte_level(std::string& out, std::string_view bytes) {
  const auto& t = byte_level_tables();
  for (char c : bytes) append_utf8(out, t.to_cp[static_cast<uint8_t>(c)]);
}

std::string nfc(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                   &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}

}  // namespace rill::text
