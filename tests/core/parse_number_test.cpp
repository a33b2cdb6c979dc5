#include "core/parse_number.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace morph {
namespace {

TEST(ParseNumber, IntegersAreWholeStrings) {
  EXPECT_EQ(parseInt64("12"), 12);
  EXPECT_EQ(parseInt64("-7"), -7);
  EXPECT_EQ(parseInt64("9223372036854775807"), INT64_MAX);
  for (const char* bad : {"", "12abc", " 12", "12 ", "+12", "1e3", "1.0", "0x10", "abc", "9223372036854775808"})
    EXPECT_FALSE(parseInt64(bad).has_value()) << bad;
}

TEST(ParseNumber, NumbersAreWholeAndFinite) {
  EXPECT_DOUBLE_EQ(*parseDouble("1.5"), 1.5);
  EXPECT_DOUBLE_EQ(*parseDouble("-2"), -2.0);
  EXPECT_DOUBLE_EQ(*parseDouble("3e-4"), 3e-4);
  for (const char* bad : {"", "1.5x", " 1", "inf", "nan", "1e999", "0x1p3", "--1"})
    EXPECT_FALSE(parseDouble(bad).has_value()) << bad;
}

TEST(ParseNumber, ErrorsNameTheSettingAndTheRange) {
  EXPECT_EQ(parseInt64Or("64", "MORPH_BUCKET_BYTES", 1, 100), 64);
  try {
    parseInt64Or("25M", "MORPH_BUCKET_BYTES", 1, 100);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "MORPH_BUCKET_BYTES '25M': expected an integer in [1, 100]");
  }
  EXPECT_THROW(parseInt64Or("0", "X", 1, 100), InputError);
  // parseDoubleOr's user: the test harness's emulated link (tests/cli/crashy_main.cpp).
  const std::string delay = "MORPH_TEST_PIPE_DELAY_MS (MEAN[:JITTER] ms)";
  EXPECT_DOUBLE_EQ(parseDoubleOr("2.5", delay, 0.0, 10.0), 2.5);
  EXPECT_DOUBLE_EQ(parseDoubleOr("0", delay, 0.0, 10.0), 0.0);
  EXPECT_DOUBLE_EQ(parseDoubleOr("10", delay, 0.0, 10.0), 10.0);
  for (const char* bad : {"10.5", "2.5ms", "", "nan"}) EXPECT_THROW(parseDoubleOr(bad, delay, 0.0, 10.0), InputError) << bad;
  try {
    parseDoubleOr("-1", delay, 0.0, 10.0);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "MORPH_TEST_PIPE_DELAY_MS (MEAN[:JITTER] ms) '-1': expected a number in [0, 10]");
  }
}

}  // namespace
}  // namespace morph
