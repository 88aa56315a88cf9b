// GPT-2's byte-to-unicode map, written out independently of the library's
// (common/text/tokenizer.cc), for tests that build byte-level vocabularies.
#ifndef E3_TESTS_COMMON_BYTE_CHAR_H_
#define E3_TESTS_COMMON_BYTE_CHAR_H_

#include <string>

namespace e3::testing {

// The character byte b stands for in a byte-level token, as UTF-8: the
// printable bytes are themselves, the others 256, 257, ... in byte order.
inline std::string ByteChar(int b) {
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE; };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += !printable(c);
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

}  // namespace e3::testing

#endif  // E3_TESTS_COMMON_BYTE_CHAR_H_
