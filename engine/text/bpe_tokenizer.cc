// BpeTokenizer: Hugging Face tokenizer.json BPE tokenizers (the header lists what is followed).
//
// Layout: bpe_tokenizer_config.cc reads tokenizer.json and tokenizer_config.json into the
// structures of bpe_tokenizer_internal.h; this file encodes (added-token split, normalization,
// pre-tokenization, the BPE merge loop) and decodes (the decode stream) with them.
//
// Byte-level shortcut: when the last pre-tokenizer step is ByteLevel, the pieces are not mapped to
// the byte-level alphabet (Ġ for a space, ...) as HF does: the BPE model starts from each byte's
// single-character token and the merges work on ids, which gives the same ids. The mapped text is
// built only where the model needs a string (ignore_merges' whole-word lookup, and a byte whose
// character is missing from the vocabulary, which then takes HF's general path).

#include "engine/text/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "engine/text/bpe_tokenizer_internal.h"
#include "engine/text/text_regex.h"
#include "engine/text/text_unicode.h"

namespace moebatch {
namespace bpe_internal {
namespace {

// bytes_char(): byte -> the code point GPT-2's byte-level alphabet uses for it.
std::array<char32_t, 256> MakeBytesChar() {
  std::array<char32_t, 256> table{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  char32_t n = 0;
  for (int b = 0; b < 256; ++b) table[b] = direct[b] ? static_cast<char32_t>(b) : 256 + n++;
  return table;
}

}  // namespace

const std::array<char32_t, 256>& BytesChar() {
  static const std::array<char32_t, 256> table = MakeBytesChar();
  return table;
}

// The UTF-8 of each byte's byte-level character.
const std::array<std::string, 256>& BytesCharUtf8() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    for (int b = 0; b < 256; ++b) AppendUtf8(BytesChar()[b], &t[b]);
    return t;
  }();
  return table;
}

// The byte a byte-level character stands for, or -1.
int CharByte(char32_t c) {
  static const absl::flat_hash_map<char32_t, int> inverse = [] {
    absl::flat_hash_map<char32_t, int> m;
    for (int b = 0; b < 256; ++b) m[BytesChar()[b]] = b;
    return m;
  }();
  const auto it = inverse.find(c);
  return it == inverse.end() ? -1 : it->second;
}

std::string MapToByteLevel(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char ch : raw) out += BytesCharUtf8()[static_cast<unsigned char>(ch)];
  return out;
}

}  // namespace bpe_internal

using bpe_internal::AddedToken;
using bpe_internal::Behavior;
using bpe_internal::CharByte;
using bpe_internal::DecoderStep;
using bpe_internal::ForEachChar;
using bpe_internal::kIdSpecial;
using bpe_internal::kIdUsed;
using bpe_internal::MapToByteLevel;
using bpe_internal::NormalizerStep;
using bpe_internal::Piece;
using bpe_internal::PreTokenizerStep;
using bpe_internal::Segment;
using bpe_internal::TokenTrie;

BpeTokenizer::BpeTokenizer() : impl_(std::make_unique<Impl>()) {}
BpeTokenizer::~BpeTokenizer() = default;

int32_t BpeTokenizer::TokenToId(std::string_view token) const {
  if (token.empty()) return -1;
  const std::string key(token);
  if (const auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) {
    return impl_->added[it->second].id;
  }
  const auto it = impl_->vocab.find(key);
  return it == impl_->vocab.end() ? -1 : it->second;
}

const std::string* BpeTokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !(id_flags_[id] & kIdUsed)) return nullptr;
  return &id_text_[id];
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && (id_flags_[id] & kIdSpecial);
}

// ---- encoding --------------------------------------------------------------------------------

std::string BpeTokenizer::Impl::Normalize(std::string_view text) const {
  std::string s(text);
  std::vector<TextRegex::Span> spans;
  for (const NormalizerStep& step : normalizer) {
    switch (step.kind) {
      case NormalizerStep::kUnicode:
        s = NormalizeUnicode(s, step.form);
        break;
      case NormalizerStep::kPrepend:
        if (!s.empty()) s = step.text + s;
        break;
      case NormalizerStep::kReplace: {
        step.regex.FindMatches(s, &spans);
        std::string out;
        out.reserve(s.size());
        for (const TextRegex::Span& sp : spans) {
          if (sp.match)
            out += step.text;
          else
            out.append(s, sp.start, sp.end - sp.start);
        }
        s = std::move(out);
        break;
      }
    }
  }
  return s;
}

// AddedVocabulary::find_matches: the text cut into added tokens and the text between them.
void BpeTokenizer::Impl::SplitAdded(std::string_view text, const TokenTrie& trie,
                                    bool parse_special, std::vector<Segment>* out) const {
  out->clear();
  if (trie.empty()) {
    out->push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0, from = 0;
  while (auto m = trie.Find(text, from)) {
    auto [start, stop, index] = *m;
    from = stop;
    const AddedToken& t = added[index];
    if (!parse_special && t.special) continue;
    if (t.single_word) {
      // The character before must not be a word character, nor the one after.
      bool start_space = true, stop_space = true;
      if (start > 0) {
        size_t p = start - 1;
        while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        start_space = !word_char.MatchesAt(text, p);
      }
      if (stop < text.size()) stop_space = !word_char.MatchesAt(text, stop);
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {  // swallow the white space before it (not before start_offset)
      size_t p = start;
      while (p > start_offset) {
        size_t q = p - 1;
        while (q > 0 && (static_cast<unsigned char>(text[q]) & 0xC0) == 0x80) --q;
        const size_t len = Utf8CharLength(text, q);
        if (len == 0 || !IsUnicodeWhiteSpace(Utf8Decode(text, q, len))) break;
        p = q;
      }
      start = std::max(p, start_offset);
    }
    if (t.rstrip) {  // and after it
      while (stop < text.size()) {
        const size_t len = Utf8CharLength(text, stop);
        if (len == 0 || !IsUnicodeWhiteSpace(Utf8Decode(text, stop, len))) break;
        stop += len;
      }
      from = stop;
    }
    if (start_offset < start) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out->push_back({start_offset, text.size(), -1});
}

namespace {

// NormalizedString::split's handling of the spans a pattern found (tokenizers/src/tokenizer/
// normalizer.rs): which [start, end) pieces remain.
void ApplyBehavior(const std::vector<TextRegex::Span>& spans, Behavior behavior,
                   std::vector<std::pair<size_t, size_t>>* pieces) {
  pieces->clear();
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& s : spans) pieces->emplace_back(s.start, s.end);
      return;
    case Behavior::kRemoved:
      for (const auto& s : spans) {
        if (!s.match) pieces->emplace_back(s.start, s.end);
      }
      return;
    case Behavior::kContiguous: {
      bool previous = false;
      for (size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].match == previous) {
          pieces->back().second = spans[i].end;
        } else {
          pieces->emplace_back(spans[i].start, spans[i].end);
        }
        previous = spans[i].match;
      }
      return;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const auto& s : spans) {
        if (s.match && !previous && !pieces->empty()) {
          pieces->back().second = s.end;
        } else {
          pieces->emplace_back(s.start, s.end);
        }
        previous = s.match;
      }
      return;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;  // whether the span to the right matched
      for (size_t k = spans.size(); k-- > 0;) {
        const auto& s = spans[k];
        if (s.match && !previous && !pieces->empty()) {
          pieces->back().first = s.start;
        } else {
          pieces->emplace_back(s.start, s.end);
        }
        previous = s.match;
      }
      std::reverse(pieces->begin(), pieces->end());
      return;
    }
  }
}

}  // namespace

void BpeTokenizer::Impl::PreTokenize(Piece first, std::vector<Piece>* out) const {
  out->clear();
  out->push_back(std::move(first));
  std::vector<Piece> next;
  std::vector<TextRegex::Span> spans;
  std::vector<std::pair<size_t, size_t>> cuts;
  for (size_t k = 0; k < pre_tokenizer.size(); ++k) {
    const PreTokenizerStep& step = pre_tokenizer[k];
    const bool last = k + 1 == pre_tokenizer.size();
    next.clear();
    for (Piece& piece : *out) {
      if (step.kind == PreTokenizerStep::kMetaspace) {
        std::string s;
        s.reserve(piece.text.size() + 3);
        for (char ch : piece.text) {
          if (ch == ' ')
            s += step.replacement;
          else
            s.push_back(ch);
        }
        const bool starts = s.compare(0, step.replacement.size(), step.replacement) == 0;
        if (!starts && (step.prepend == PreTokenizerStep::kAlways ||
                        (step.prepend == PreTokenizerStep::kFirst && piece.at_origin))) {
          s.insert(0, step.replacement);
        }
        piece.text = std::move(s);
        if (!step.split) {
          if (!piece.text.empty()) next.push_back(std::move(piece));
          continue;
        }
      } else if (step.kind == PreTokenizerStep::kByteLevel) {
        if (step.add_prefix_space && (piece.text.empty() || piece.text[0] != ' ')) {
          piece.text.insert(0, " ");
        }
        if (!step.use_regex) {
          if (!piece.text.empty()) next.push_back(std::move(piece));
          continue;
        }
      }
      const std::string& s = piece.text;
      step.regex.FindMatches(s, &spans);
      if (step.invert) {
        for (auto& sp : spans) sp.match = !sp.match;
      }
      ApplyBehavior(spans, step.behavior, &cuts);
      for (const auto& [a, b] : cuts) {
        if (a == b) continue;  // empty splits are dropped
        next.push_back(Piece{s.substr(a, b - a), piece.at_origin && a == 0, false});
      }
    }
    if (step.kind == PreTokenizerStep::kByteLevel) {
      for (Piece& p : next) {
        if (last && last_step_byte_level) {
          p.byte_mapped = true;
        } else {
          p.text = MapToByteLevel(p.text);
        }
      }
    }
    out->swap(next);
  }
}

// Word::merge_all: the min-heap of (rank, position) over the symbols, stale entries skipped.
void BpeTokenizer::Impl::MergeSymbols(std::vector<int32_t>* ids) const {
  const size_t n = ids->size();
  if (n < 2 || merges.empty()) return;
  struct Symbol {
    int32_t c;
    int32_t prev, next;
    bool alive;
  };
  struct Merge {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
    bool operator<(const Merge& o) const {  // the heap's top is the smallest (rank, pos)
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Merge> heap;
  symbols.resize(n);
  heap.clear();
  auto find = [&](int32_t a, int32_t b) -> const std::pair<uint32_t, int32_t>* {
    const auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
                                static_cast<uint32_t>(b));
    return it == merges.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i < n; ++i) {
    symbols[i] = {(*ids)[i], static_cast<int32_t>(i) - 1,
                  i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
    if (i + 1 < n) {
      if (const auto* m = find((*ids)[i], (*ids)[i + 1])) {
        heap.push_back({m->first, static_cast<uint32_t>(i), m->second});
      }
    }
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Merge top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    const Symbol right = symbols[left.next];
    const auto* m = find(left.c, right.c);
    if (m == nullptr || m->second != top.new_id) continue;  // an expired entry
    symbols[left.next].alive = false;
    left.c = top.new_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0) {
      if (const auto* pm = find(symbols[left.prev].c, left.c)) {
        heap.push_back({pm->first, static_cast<uint32_t>(left.prev), pm->second});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (left.next >= 0) {
      if (const auto* nm = find(left.c, symbols[left.next].c)) {
        heap.push_back({nm->first, top.pos, nm->second});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  ids->clear();
  for (size_t i = 0; i < n; ++i) {
    if (symbols[i].alive) ids->push_back(symbols[i].c);
  }
}

// BPE::merge_word on the characters of `word` (text in the vocabulary's alphabet).
void BpeTokenizer::Impl::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  // An unknown character's <unk> waits until a known character (or the end) follows, as HF's
  // `unk` variable: byte-fallback bytes may come before it, and with fuse_unk one <unk> stands
  // for a run of unknown characters.
  bool unk_pending = false;
  std::string s;
  ForEachChar(word, [&](size_t i, size_t len, char32_t) {
    const bool is_first = i == 0, is_last = i + len == word.size();
    s.assign(word.substr(i, len));
    if (!is_first && !continuing_subword_prefix.empty()) s.insert(0, continuing_subword_prefix);
    if (is_last && !end_of_word_suffix.empty()) s += end_of_word_suffix;
    if (const auto it = vocab.find(s); it != vocab.end()) {
      if (unk_pending) ids.push_back(unk_id);
      unk_pending = false;
      ids.push_back(it->second);
      return;
    }
    if (byte_fallback) {
      bool all = true;
      for (char ch : s) all = all && byte_token[static_cast<unsigned char>(ch)] >= 0;
      if (all) {
        for (char ch : s) ids.push_back(byte_token[static_cast<unsigned char>(ch)]);
        return;
      }
    }
    if (unk_id >= 0) {
      if (unk_pending && !fuse_unk) ids.push_back(unk_id);
      unk_pending = true;
    }
  });
  if (unk_pending) ids.push_back(unk_id);
  MergeSymbols(&ids);
  out->insert(out->end(), ids.begin(), ids.end());
}

void BpeTokenizer::Impl::Tokenize(const Piece& piece, std::vector<int32_t>* out) const {
  const std::string& w = piece.text;
  if (w.empty()) return;
  const bool cacheable = w.size() < kCacheMaxWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu);
    const auto it = cache.find(w);
    if (it != cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  if (piece.byte_mapped) {
    bool direct = true;
    if (ignore_merges) {
      const auto it = vocab.find(MapToByteLevel(w));
      if (it != vocab.end()) {
        ids.push_back(it->second);
        direct = false;
      }
    }
    if (direct) {
      for (char ch : w) {
        const int32_t id = byte_char_id[static_cast<unsigned char>(ch)];
        if (id < 0) {
          direct = false;
          break;
        }
        ids.push_back(id);
      }
      if (direct) {
        MergeSymbols(&ids);
      } else {
        ids.clear();
        MergeWord(MapToByteLevel(w), &ids);
      }
    }
  } else {
    const auto it = ignore_merges ? vocab.find(w) : vocab.end();
    if (it != vocab.end()) {
      ids.push_back(it->second);
    } else {
      MergeWord(w, &ids);
    }
  }
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu);
    if (cache.size() < kCacheCapacity) cache.emplace(w, std::move(ids));
  }
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view input,
                                          const BpeEncodeOptions& options) const {
  const Impl& m = *impl_;
  std::string repaired;
  std::string_view text = input;
  if (!IsValidUtf8(input)) {
    AppendUtf8Lossy(input, &repaired);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  std::vector<Segment> raw, normalized;
  std::vector<Piece> pieces;
  m.SplitAdded(text, m.raw_trie, options.parse_special, &raw);
  for (const Segment& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    if (seg.start == seg.end) continue;
    const std::string norm = m.Normalize(text.substr(seg.start, seg.end - seg.start));
    m.SplitAdded(norm, m.normalized_trie, options.parse_special, &normalized);
    for (const Segment& sub : normalized) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      if (sub.start == sub.end) continue;
      m.PreTokenize(Piece{norm.substr(sub.start, sub.end - sub.start),
                          seg.start == 0 && sub.start == 0, false},
                    &pieces);
      for (const Piece& p : pieces) m.Tokenize(p, &ids);
    }
  }
  if (options.add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  BpeDecodeStream stream(*this, skip_special_tokens);
  std::string text;
  for (int32_t id : ids) text += stream.Add(id);
  text += stream.Finish();
  return text;
}

// ---- decoding --------------------------------------------------------------------------------

namespace {

// ByteFallback's test: a token that is exactly "<0xNN>" (hex digits in either case).
int FallbackByte(std::string_view t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int value = 0;
  for (size_t k = 3; k < 5; ++k) {
    const char h = t[k];
    const int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                         : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

// The byte-level decoder's bytes for one token: each character's byte when every character is in
// the byte-level alphabet, else the token's own UTF-8.
void AppendTokenBytes(std::string_view token, std::string* bytes) {
  const size_t before = bytes->size();
  bool all = true;
  ForEachChar(token, [&](size_t, size_t, char32_t c) {
    if (!all) return;
    const int b = CharByte(c);
    if (b < 0) {
      all = false;
      return;
    }
    bytes->push_back(static_cast<char>(b));
  });
  if (!all) {
    bytes->resize(before);
    bytes->append(token);
  }
}

std::string ApplyReplace(const DecoderStep& step, std::string_view token) {
  std::vector<TextRegex::Span> spans;
  step.regex.FindMatches(token, &spans);
  std::string out;
  for (const auto& sp : spans) {
    if (sp.match)
      out += step.content;
    else
      out.append(token.substr(sp.start, sp.end - sp.start));
  }
  return out;
}

// Strip::decode_chain on one whole token.
std::string ApplyStrip(const DecoderStep& step, std::string_view token) {
  std::vector<std::pair<size_t, size_t>> chars;  // (offset, length)
  std::vector<char32_t> cps;
  ForEachChar(token, [&](size_t i, size_t len, char32_t c) {
    chars.emplace_back(i, len);
    cps.push_back(c);
  });
  size_t start_cut = 0;
  for (size_t i = 0; i < step.start && i < cps.size(); ++i) {
    if (cps[i] != step.strip) break;
    start_cut = i + 1;
  }
  size_t stop_cut = cps.size();
  for (size_t i = 0; i < step.stop && i < cps.size(); ++i) {
    const size_t index = cps.size() - i - 1;
    if (cps[index] != step.strip) break;
    stop_cut = index;
  }
  if (stop_cut <= start_cut) return std::string();
  const size_t a = chars[start_cut].first;
  const size_t b = stop_cut == cps.size() ? token.size() : chars[stop_cut].first;
  return std::string(token.substr(a, b - a));
}

std::string ApplyMetaspace(const DecoderStep& step, std::string_view token, bool first) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  const std::string& r = step.replacement;
  while (i < token.size()) {
    if (token.compare(i, r.size(), r) == 0) {
      if (!(first && !step.prepend_never)) out.push_back(' ');
      i += r.size();
    } else {
      out.push_back(token[i++]);
    }
  }
  return out;
}

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";

}  // namespace

std::string BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !(id_flags_[id] & kIdUsed)) return std::string();
  std::string item = id_text_[id];
  if (id_flags_[id] & kIdSpecial) return item;
  for (const DecoderStep& step : impl_->decoder) {
    switch (step.kind) {
      case DecoderStep::kByteLevel: {
        std::string bytes;
        AppendTokenBytes(item, &bytes);
        item = std::move(bytes);
        break;
      }
      case DecoderStep::kByteFallback:
        if (const int b = FallbackByte(item); b >= 0) item = std::string(1, static_cast<char>(b));
        break;
      case DecoderStep::kReplace:
        item = ApplyReplace(step, item);
        break;
      case DecoderStep::kMetaspace:
        item = ApplyMetaspace(step, item, /*first=*/false);
        break;
      case DecoderStep::kStrip:
      case DecoderStep::kFuse:
      case DecoderStep::kJoinSpace:
        break;
    }
  }
  return item;
}

BpeDecodeStream::BpeDecodeStream(const BpeTokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer),
      skip_special_(skip_special_tokens),
      states_(tokenizer.impl_->decoder.size()) {}

std::string BpeDecodeStream::Add(int32_t id) {
  const BpeTokenizer& t = *tokenizer_;
  if (id < 0 || id >= t.vocab_size() || !(t.id_flags_[id] & kIdUsed)) return std::string();
  if (skip_special_ && (t.id_flags_[id] & kIdSpecial)) return std::string();
  std::string out;
  Push(0, t.id_text_[id], &out);
  return out;
}

std::string BpeDecodeStream::Finish() {
  std::string out;
  FinishFrom(0, &out);
  return out;
}

// Feeds `item` (a token, or a chunk of the one fused token) to decoder step `k`.
void BpeDecodeStream::Push(size_t k, std::string_view item, std::string* out) {
  const std::vector<DecoderStep>& steps = tokenizer_->impl_->decoder;
  if (k == steps.size()) {
    out->append(item);
    return;
  }
  const DecoderStep& step = steps[k];
  BpeDecodeStepState& st = states_[k];
  switch (step.kind) {
    case DecoderStep::kByteLevel: {
      if (step.fused) {  // a byte-level step after a fusing one: decided only by the whole token
        st.pending.append(item);
        return;
      }
      AppendTokenBytes(item, &st.pending);
      const size_t keep = Utf8UnfinishedTail(st.pending);
      if (keep == st.pending.size()) return;
      std::string text;
      AppendUtf8Lossy(std::string_view(st.pending).substr(0, st.pending.size() - keep), &text);
      st.pending.erase(0, st.pending.size() - keep);
      Push(k + 1, text, out);
      return;
    }
    case DecoderStep::kByteFallback: {
      if (step.fused) {
        st.pending.append(item);
        return;
      }
      const int b = FallbackByte(item);
      if (b >= 0) {
        st.pending.push_back(static_cast<char>(b));
        return;
      }
      if (!st.pending.empty()) {
        std::string run;
        run.swap(st.pending);
        if (IsValidUtf8(run)) {
          Push(k + 1, run, out);
        } else {
          for (size_t i = 0; i < run.size(); ++i) Push(k + 1, kReplacementChar, out);
        }
      }
      Push(k + 1, item, out);
      return;
    }
    case DecoderStep::kFuse:
    case DecoderStep::kJoinSpace:
      if (step.kind == DecoderStep::kJoinSpace && !step.fused && st.count++ > 0) {
        Push(k + 1, " ", out);
      }
      Push(k + 1, item, out);
      return;
    case DecoderStep::kReplace: {
      if (!step.fused) {
        Push(k + 1, ApplyReplace(step, item), out);
        return;
      }
      st.pending.append(item);
      if (!step.literal || step.pattern.empty()) return;  // a regex sees the whole token
      // Replace every complete occurrence; hold back a tail that could start one.
      std::string text;
      size_t pos = 0;
      for (size_t f; (f = st.pending.find(step.pattern, pos)) != std::string::npos;
           pos = f + step.pattern.size()) {
        text.append(st.pending, pos, f - pos);
        text += step.content;
      }
      size_t hold = 0;
      const size_t rest = st.pending.size() - pos;
      for (size_t h = std::min(rest, step.pattern.size() - 1); h > 0; --h) {
        if (st.pending.compare(st.pending.size() - h, h, step.pattern, 0, h) == 0) {
          hold = h;
          break;
        }
      }
      text.append(st.pending, pos, rest - hold);
      st.pending.erase(0, st.pending.size() - hold);
      if (!text.empty()) Push(k + 1, text, out);
      return;
    }
    case DecoderStep::kStrip: {
      if (!step.fused) {
        Push(k + 1, ApplyStrip(step, item), out);
        return;
      }
      // One token in chunks: drop up to `start` leading content characters; hold back a run of
      // content characters at the end (up to `stop` of them are dropped at Finish).
      std::string text;
      ForEachChar(item, [&](size_t i, size_t len, char32_t c) {
        if (!st.done) {
          if (c == step.strip && st.count < step.start) {
            ++st.count;
            return;
          }
          st.done = true;
        }
        if (step.stop > 0 && c == step.strip) {
          st.pending.append(item.substr(i, len));
          return;
        }
        text += st.pending;
        st.pending.clear();
        text.append(item.substr(i, len));
      });
      if (!text.empty()) Push(k + 1, text, out);
      return;
    }
    case DecoderStep::kMetaspace: {
      const bool first = step.fused || st.count == 0;
      ++st.count;
      Push(k + 1, ApplyMetaspace(step, item, first), out);
      return;
    }
  }
}

void BpeDecodeStream::FinishFrom(size_t k, std::string* out) {
  const std::vector<DecoderStep>& steps = tokenizer_->impl_->decoder;
  if (k == steps.size()) return;
  const DecoderStep& step = steps[k];
  BpeDecodeStepState& st = states_[k];
  std::string pending;
  pending.swap(st.pending);
  switch (step.kind) {
    case DecoderStep::kByteLevel:
      if (!pending.empty()) {
        std::string bytes, text;
        if (step.fused) {
          AppendTokenBytes(pending, &bytes);
        } else {
          bytes = std::move(pending);
        }
        AppendUtf8Lossy(bytes, &text);
        Push(k + 1, text, out);
      }
      break;
    case DecoderStep::kByteFallback:
      if (step.fused) {
        const int b = FallbackByte(pending);
        if (b < 0) {
          Push(k + 1, pending, out);
        } else {
          const std::string one(1, static_cast<char>(b));
          Push(k + 1, IsValidUtf8(one) ? std::string_view(one) : std::string_view(kReplacementChar),
               out);
        }
      } else if (!pending.empty()) {
        if (IsValidUtf8(pending)) {
          Push(k + 1, pending, out);
        } else {
          for (size_t i = 0; i < pending.size(); ++i) Push(k + 1, kReplacementChar, out);
        }
      }
      break;
    case DecoderStep::kReplace:
      if (!pending.empty()) {
        Push(k + 1, step.literal && !step.pattern.empty() ? pending : ApplyReplace(step, pending),
             out);
      }
      break;
    case DecoderStep::kStrip:
      if (!pending.empty()) {  // a run of content characters at the very end
        std::vector<size_t> starts;
        ForEachChar(pending, [&](size_t i, size_t, char32_t) { starts.push_back(i); });
        const size_t drop = std::min(step.stop, starts.size());
        pending.resize(drop == 0 ? pending.size() : starts[starts.size() - drop]);
        if (!pending.empty()) Push(k + 1, pending, out);
      }
      break;
    default:
      break;
  }
  FinishFrom(k + 1, out);
}

}  // namespace moebatch
