#include "common/text/unicode.h"

#include <algorithm>
#include <array>

#include "common/text/unicode_data.h"

namespace e3::unicode {
namespace {

namespace ud = ::e3::unicode_data;

constexpr char32_t kReplacementChar = 0xFFFD;
// Invalid bytes ride through NFC as code points above the Unicode range.
constexpr char32_t kRawByteBase = 0x110000;

// Hangul syllable arithmetic (Unicode 15.0 section 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

template <typename Range>
const Range* FindRange(const Range* table, size_t n, char32_t cp) {
  const Range* end = table + n;
  const Range* it =
      std::upper_bound(table, end, cp, [](char32_t c, const Range& r) { return c < r.first; });
  if (it == table) return nullptr;
  --it;
  return cp <= it->last ? it : nullptr;
}

uint8_t CombiningClass(char32_t cp) {
  if (cp < 0x300 || cp >= kRawByteBase) return 0;
  const ud::CccRange* r = FindRange(ud::kCccRanges, ud::kNumCccRanges, cp);
  return r == nullptr ? 0 : r->ccc;
}

bool IsNfcUnstable(char32_t cp) {
  return cp >= 0x300 && FindRange(ud::kNfcUnstable, ud::kNumNfcUnstable, cp) != nullptr;
}

// Primary composite of `a` + `b`, or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const ud::Composition* end = ud::kCompositions + ud::kNumCompositions;
  const ud::Composition* it = std::lower_bound(
      ud::kCompositions, end, std::make_pair(a, b), [](const ud::Composition& c, auto key) {
        return c.first != key.first ? c.first < key.first : c.second < key.second;
      });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

struct NfcChar {
  char32_t cp;
  uint8_t ccc;
  uint32_t begin, end;  // input bytes it came from
};

void Decompose(char32_t cp, uint32_t begin, uint32_t end, std::vector<NfcChar>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out->push_back({kLBase + s / kNCount, 0, begin, end});
    out->push_back({kVBase + (s % kNCount) / kTCount, 0, begin, end});
    if (s % kTCount != 0) out->push_back({kTBase + s % kTCount, 0, begin, end});
    return;
  }
  const ud::Decomposition* table_end = ud::kDecompositions + ud::kNumDecompositions;
  const ud::Decomposition* it =
      std::lower_bound(ud::kDecompositions, table_end, cp,
                       [](const ud::Decomposition& d, char32_t c) { return d.cp < c; });
  if (it != table_end && it->cp == cp) {
    for (int i = 0; i < it->len; ++i) {
      const char32_t part = ud::kDecompositionData[it->offset + i];
      out->push_back({part, CombiningClass(part), begin, end});
    }
    return;
  }
  out->push_back({cp, CombiningClass(cp), begin, end});
}

}  // namespace

DecodedChar DecodeUtf8(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return {b0, 1, true};
  int need;
  char32_t cp;
  // The first continuation byte's range excludes overlongs and surrogates.
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {b0, 1, false};
  }
  uint32_t len = 1;
  for (int i = 0; i < need; ++i, ++len) {
    if (pos + len >= s.size()) return {b0, len, false};
    const uint8_t b = byte(pos + len);
    if (i == 0 ? (b < lo || b > hi) : !IsContinuation(b)) return {b0, len, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, len, true};
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string ToValidUtf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const DecodedChar c = DecodeUtf8(bytes, i);
    if (c.valid) {
      out.append(bytes.substr(i, c.len));
    } else {
      AppendUtf8(kReplacementChar, &out);
    }
    i += c.len;
  }
  return out;
}

CharClass ClassOf(char32_t cp) {
  static const std::array<CharClass, 128> kAscii = [] {
    std::array<CharClass, 128> t{};
    for (int c = 0; c < 128; ++c) {
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        t[c] = CharClass::kLetter;
      } else if (c >= '0' && c <= '9') {
        t[c] = CharClass::kNumber;
      } else if ((c >= 0x09 && c <= 0x0D) || c == ' ') {
        t[c] = CharClass::kSpace;
      }
    }
    return t;
  }();
  if (cp < 128) return kAscii[cp];
  const ud::ClassRange* r = FindRange(ud::kClassRanges, ud::kNumClassRanges, cp);
  return r == nullptr ? CharClass::kOther : static_cast<CharClass>(r->cls);
}

bool IsPythonSpace(char32_t cp) {
  return (cp >= 0x1C && cp <= 0x1F) || ClassOf(cp) == CharClass::kSpace;
}

bool MayNeedNfc(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    // U+0300 is the first unstable code point; its lead byte is 0xCC.
    if (static_cast<uint8_t>(s[i]) < 0xCC) {
      ++i;
      continue;
    }
    const DecodedChar c = DecodeUtf8(s, i);
    if (c.valid && IsNfcUnstable(c.cp)) return true;
    i += c.len;
  }
  return false;
}

std::string Nfc(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>* alignment) {
  // Canonical decomposition, then canonical ordering, then composition
  // (UAX #15), each character carrying the input bytes it came from.
  std::vector<NfcChar> chars;
  chars.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const DecodedChar c = DecodeUtf8(s, i);
    const auto begin = static_cast<uint32_t>(i);
    if (c.valid) {
      Decompose(c.cp, begin, begin + c.len, &chars);
      i += c.len;
    } else {
      chars.push_back({kRawByteBase + static_cast<uint8_t>(s[i]), 0, begin, begin + 1});
      ++i;
    }
  }
  for (size_t i = 0; i < chars.size();) {
    if (chars[i].ccc == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < chars.size() && chars[j].ccc != 0) ++j;
    std::stable_sort(chars.begin() + i, chars.begin() + j,
                     [](const NfcChar& a, const NfcChar& b) { return a.ccc < b.ccc; });
    i = j;
  }
  std::vector<NfcChar> composed;
  composed.reserve(chars.size());
  size_t starter = SIZE_MAX;
  for (const NfcChar& c : chars) {
    if (starter != SIZE_MAX && c.cp < kRawByteBase) {
      // A character between the starter and `c` blocks them unless its
      // class is nonzero and below c's.
      const bool adjacent = starter + 1 == composed.size();
      const uint8_t last_ccc = composed.back().ccc;
      if (adjacent || (last_ccc != 0 && last_ccc < c.ccc)) {
        NfcChar& s_char = composed[starter];
        // The composite keeps the starter's input range, as HF's
        // NormalizedString aligns it; the mark's bytes map to no output.
        if (const char32_t both = Compose(s_char.cp, c.cp); both != 0) {
          s_char.cp = both;
          continue;
        }
      }
    }
    if (c.ccc == 0) starter = composed.size();
    composed.push_back(c);
  }
  std::string out;
  out.reserve(s.size());
  if (alignment != nullptr) alignment->clear();
  for (const NfcChar& c : composed) {
    if (c.cp >= kRawByteBase) {
      out.push_back(static_cast<char>(c.cp - kRawByteBase));
    } else {
      AppendUtf8(c.cp, &out);
    }
    if (alignment != nullptr) alignment->resize(out.size(), {c.begin, c.end});
  }
  return out;
}

}  // namespace e3::unicode
