// CRC-32C against published answers (the check value of the CRC catalogue,
// RFC 3720's iSCSI vectors), TFRecord's masked form against TensorBoard's
// own Python implementation, and the ways a CRC is continued: across
// calls, across ISA-L's int-sized chunks and across a file's reads.
#include "common/base/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/base/file_util.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

uint32_t Crc(const std::string& s) { return Crc32c(s.data(), s.size()); }

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

TEST(Crc32cTest, MatchesPublishedAnswers) {
  EXPECT_EQ(Crc("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc(""), 0u);
  // RFC 3720, B.4: 32 bytes of zeros, of ones, ascending, descending.
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(Crc(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, ContinuesAcrossCallsAtEverySplit) {
  const std::string bytes = RandomBytes(300, 1);
  const uint32_t whole = Crc(bytes);
  for (size_t split = 0; split <= bytes.size(); ++split) {
    const uint32_t head = Crc32c(bytes.data(), split);
    EXPECT_EQ(Crc32c(bytes.data() + split, bytes.size() - split, head), whole) << "split " << split;
  }
}

TEST(Crc32cTest, ChunkedPassesAgreeWithOnePass) {
  const std::string bytes = RandomBytes((size_t{1} << 20) + 77, 2);
  const uint32_t whole = Crc(bytes);
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{4096}, size_t{65537}}) {
    EXPECT_EQ(crc32c_internal::Crc32cChunked(bytes.data(), bytes.size(), 0, chunk), whole)
        << "chunks of " << chunk;
  }
  const uint32_t head = Crc32c(bytes.data(), 1000);
  EXPECT_EQ(crc32c_internal::Crc32cChunked(bytes.data() + 1000, bytes.size() - 1000, head, 13),
            whole);
}

// tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py masked_crc32c.
TEST(Crc32cTest, MaskedMatchesTensorBoard) {
  EXPECT_EQ(MaskedCrc32c("123456789", 9), 0xC78AB0E5u);
  EXPECT_EQ(MaskedCrc32c("", 0), 0xA282EAD8u);
  const uint32_t crc = Crc("123456789");
  EXPECT_EQ(MaskedCrc32c("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xA282EAD8u);
}

// Larger than two of Crc32cOfFile's 4 MiB reads, ending mid-read.
TEST(Crc32cTest, OfFileAgreesWithTheBytes) {
  const std::string bytes = RandomBytes((size_t{9} << 20) + 123, 3);
  const std::string path = testing::ScratchPath("crc32c_test", ".bin");
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
  absl::StatusOr<uint32_t> crc = Crc32cOfFile(path);
  ASSERT_TRUE(crc.ok()) << crc.status();
  EXPECT_EQ(*crc, Crc(bytes));
}

TEST(Crc32cTest, OfFileNamesAMissingFile) {
  const std::string path = testing::ScratchPath("crc32c_test_missing");
  absl::StatusOr<uint32_t> crc = Crc32cOfFile(path);
  ASSERT_FALSE(crc.ok());
  EXPECT_EQ(crc.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(crc.status().message().find(path), absl::string_view::npos) << crc.status();
}

}  // namespace
}  // namespace e3
