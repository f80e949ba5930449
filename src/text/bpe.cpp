#include "text/bpe.h"

#include <cstdio>
#include <queue>

#include "text/unicode.h"

namespace rill::text {

namespace {

std::array<int32_t, 256> find_byte_tokens(const TokenIndex& vocab) {
  std::array<int32_t, 256> ids;
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    ids[b] = find_token(vocab, name).value_or(-1);
  }
  return ids;
}

size_t utf8_char_len(std::string_view s, size_t i) {
  const Utf8Probe p = probe_utf8(s.substr(i, 4));
  return p.valid_prefix_len == 0 ? 1 : p.valid_prefix_len;
}

}  // namespace

BpeModel::BpeModel(const TokenIndex* vocab, BpeOptions options)
    : vocab_(vocab), options_(std::move(options)), byte_ids_(find_byte_tokens(*vocab)) {}

Status BpeModel::add_merge(std::string_view left, std::string_view right, int32_t rank, bool replace,
                           const std::string& where) {
  const auto a = find_token(*vocab_, left);
  const auto b = find_token(*vocab_, right);
  if (!a || !b) {
    return Error{where + ": merge '" + std::string(left) + " " + std::string(right) +
                 "' uses a token that is not in the vocabulary"};
  }
  std::string merged;
  merged.reserve(left.size() + right.size());
  merged.append(left).append(right);
  const auto id = find_token(*vocab_, merged);
  if (!id) return Error{where + ": merge result '" + merged + "' is not in the vocabulary"};
  if (replace)
    merges_.insert_or_assign(pair_key(*a, *b), {rank, *id});
  else
    merges_.emplace(pair_key(*a, *b), {rank, *id});
  return Status::Ok();
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = find_token(*vocab_, word)) {
      out.push_back(*id);
      return;
    }
  }

  // Doubly linked symbols; a merged-away symbol has len 0.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, size_t len) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, static_cast<uint32_t>(len)});
  };

  int32_t unk_id = -1;  // pending unknown symbol (id, byte length), -1 when none
  size_t unk_len = 0;
  const bool affixes = !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty();
  std::string affixed;
  for (size_t i = 0; i < word.size();) {
    const size_t len = utf8_char_len(word, i);
    std::string_view ch = word.substr(i, len);
    if (affixes) {
      affixed.clear();
      if (i > 0) affixed += options_.continuing_subword_prefix;
      affixed += ch;
      if (i + len == word.size()) affixed += options_.end_of_word_suffix;
      ch = affixed;
    }
    i += len;
    if (auto id = find_token(*vocab_, ch)) {
      if (unk_id >= 0) add(unk_id, unk_len), unk_id = -1;
      add(*id, len);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : ch) add(byte_ids_[static_cast<uint8_t>(c)], 1);
        continue;
      }
    }
    if (options_.unk_id) {
      if (unk_id >= 0 && options_.fuse_unk) {
        unk_len += len;
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = *options_.unk_id, unk_len = len;
      }
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  // Apply merges lowest rank first, then leftmost (tokenizers' Word::merge_all).
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator<(const Candidate& o) const {  // max-heap order: smallest rank, then pos
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  auto lookup = [&](int32_t a, int32_t b) { return merges_.find(pair_key(a, b)); };
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const auto* m = lookup(symbols[k].id, symbols[k + 1].id)) queue.push({m->rank, static_cast<int32_t>(k), m->id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    const auto* m = lookup(cur.id, right.id);
    if (m == nullptr || m->id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* pm = lookup(symbols[cur.prev].id, cur.id)) queue.push({pm->rank, cur.prev, pm->id});
    }
    if (cur.next >= 0) {
      if (const auto* nm = lookup(cur.id, symbols[cur.next].id)) queue.push({nm->rank, top.pos, nm->id});
    }
  }
  for (const auto& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

SpmModel::SpmModel(const TokenIndex* vocab, std::vector<float> scores, std::optional<int32_t> unk_id)
    : vocab_(vocab), scores_(std::move(scores)), unk_id_(unk_id), byte_ids_(find_byte_tokens(*vocab)) {
  for (int b = 0; b < 256; ++b) {
    if (byte_ids_[b] < 0) {  // llama.cpp falls back to the byte itself as a token
      const char c = static_cast<char>(b);
      byte_ids_[b] = find_token(*vocab, std::string_view(&c, 1)).value_or(-1);
    }
  }
}

void SpmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t prev, next;
    size_t begin, n;
  };
  std::vector<Symbol> symbols;
  for (size_t i = 0; i < text.size();) {
    const size_t len = std::min(utf8_char_len(text, i), text.size() - i);
    const int32_t idx = static_cast<int32_t>(symbols.size());
    symbols.push_back({idx - 1, i + len == text.size() ? -1 : idx + 1, i, len});
    i += len;
  }
  struct Bigram {
    int32_t left, right;
    float score;
    size_t size;
    bool operator<(const Bigram& o) const {  // max-heap: highest score, then leftmost
      return score < o.score || (score == o.score && left > o.left);
    }
  };
  std::priority_queue<Bigram> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left == -1 || right == -1) return;
    const std::string_view merged = text.substr(symbols[left].begin, symbols[left].n + symbols[right].n);
    const auto id = find_token(*vocab_, merged);
    if (!id || static_cast<size_t>(*id) >= scores_.size()) return;
    queue.push({left, right, scores_[*id], merged.size()});
  };
  for (int32_t k = 1; k < static_cast<int32_t>(symbols.size()); ++k) try_add(k - 1, k);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[b.left];
    Symbol& r = symbols[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  // Every merge made a vocabulary token, so a final piece that is not a
  // token is a single character outside the vocabulary: emit its bytes
  // (llama.cpp's re-segmentation along recorded merges never triggers).
  for (int32_t k = symbols.empty() ? -1 : 0; k != -1; k = symbols[k].next) {
    const std::string_view piece = text.substr(symbols[k].begin, symbols[k].n);
    if (auto id = find_token(*vocab_, piece)) {
      out.push_back(*id);
      continue;
    }
    for (char c : piece) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0)
        out.push_back(id);
      else if (unk_id_)
        out.push_back(*unk_id_);
    }
  }
}

}  // namespace rill::text
