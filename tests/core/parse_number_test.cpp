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
  EXPECT_THROW(parseDoubleOr("-1", "MORPH_PIPE_DELAY_MS", 0.0, 10.0), InputError);
  EXPECT_DOUBLE_EQ(parseDoubleOr("2.5", "MORPH_PIPE_DELAY_MS", 0.0, 10.0), 2.5);
}

}  // namespace
}  // namespace morph
