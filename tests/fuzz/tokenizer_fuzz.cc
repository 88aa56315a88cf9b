// A hostile tokenizer.json: refused naming the file, or a tokenizer whose
// encodings of awkward text (invalid UTF-8, CJK, emoji, whitespace runs,
// special-token look-alikes) have in-range ids and offsets that lie in the
// text (also through the post_processor, single and pair), and whose
// decode returns.
#include <algorithm>
#include <cstdint>
#include <string>

#include "common/text/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

const std::string kText =
    "def f(x):\n\treturn x  +  1 \xf0\x9f\x98\x80 \xe4\xbd\xa0\xe5\xa5\xbd <|eot_id|><s></s> "
    "\xff\xfe\xc3 caf\xc3\xa9"
    "e\xcc\x81   \r\n\n  end";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = e3::fuzz::AsFile(data, size, "tokenizer.json");
  auto tok = e3::Tokenizer::FromFile(path);
  if (!tok.ok()) {
    E3_FUZZ_CHECK(tok.status().message().find(path) != std::string::npos);
    return 0;
  }
  const int64_t vocab = (*tok)->vocab_size();
  E3_FUZZ_CHECK(vocab >= 0);
  for (const std::string& text : {kText, std::string(), std::string(1, '\0')}) {
    e3::Encoding enc = (*tok)->Encode(text);
    E3_FUZZ_CHECK(enc.ids.size() == enc.offsets.size());
    for (size_t i = 0; i < enc.ids.size(); ++i) {
      E3_FUZZ_CHECK(enc.ids[i] >= 0 && enc.ids[i] < vocab);
      E3_FUZZ_CHECK(enc.offsets[i].first <= enc.offsets[i].second &&
                    enc.offsets[i].second <= text.size());
      E3_FUZZ_CHECK((*tok)->IdToToken(enc.ids[i]).has_value());
    }
    (void)(*tok)->Decode(enc.ids, false);
    (void)(*tok)->Decode(enc.ids, true);
    // Through the post_processor: its specials at (0, 0), trimmed offsets
    // still inside the text; a pair's in its own sequence's text.
    for (const bool add : {true, false}) {
      const e3::Encoding post = (*tok)->Encode(text, e3::EncodeOptions{add});
      E3_FUZZ_CHECK(post.ids.size() == post.offsets.size());
      for (const auto& [b, e] : post.offsets) E3_FUZZ_CHECK(b <= e && e <= text.size());
      auto pair = (*tok)->EncodePair(text, kText, e3::EncodeOptions{add});
      if (!pair.ok()) continue;
      E3_FUZZ_CHECK(pair->ids.size() == pair->offsets.size());
      for (const auto& [b, e] : pair->offsets) E3_FUZZ_CHECK(b <= e && e <= std::max(text.size(), kText.size()));
    }
  }
  // Ids outside the vocab decode to something or nothing, never a crash.
  (void)(*tok)->Decode(std::vector<int32_t>{-1, 0, static_cast<int32_t>(vocab), 2147483647}, false);
  return 0;
}
