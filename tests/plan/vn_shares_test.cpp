// Which VNs go to which worker (plan/vn_shares.h).
#include "plan/vn_shares.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"

namespace morph {
namespace {

TEST(VnShares, EvenSplitGivesTheFirstOnesOneMore) {
  EXPECT_EQ(evenShares(12, 5), (std::vector<int64_t>{3, 3, 2, 2, 2}));
  EXPECT_EQ(evenShares(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(evenShares(3, 5), (std::vector<int64_t>{1, 1, 1, 0, 0}));
}

TEST(VnShares, WeightedSharesGoToWhoFinishesFirst) {
  EXPECT_EQ(weightedShares(9, {1.0, 2.0}), (std::vector<int64_t>{6, 3}));
  EXPECT_EQ(weightedShares(12, {1.0, 4.0, 1.0}, 1), (std::vector<int64_t>{6, 1, 5}));  // ties to the lower index
  EXPECT_EQ(weightedShares(4, {1.0, 100.0}), (std::vector<int64_t>{4, 0}));
  EXPECT_THROW(weightedShares(2, {1.0, 1.0, 1.0}, 1), InputError);
}

TEST(VnShares, RangesAreContiguousInRankOrder) {
  const std::vector<VnRange> r = rangesOf({6, 1, 5});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], (VnRange{0, 6}));
  EXPECT_EQ(r[1], (VnRange{6, 7}));
  EXPECT_EQ(r[2], (VnRange{7, 12}));
  EXPECT_EQ(r[2].size(), 5);
}

TEST(VnShares, EvenRangesRejectTooManyOrNoWorkers) {
  auto p = evenRanges(12, 5);
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0], (VnRange{0, 3}));
  EXPECT_EQ(p[1], (VnRange{3, 6}));
  EXPECT_EQ(p[4], (VnRange{10, 12}));
  EXPECT_THROW(evenRanges(4, 5), InputError);
  EXPECT_THROW(evenRanges(4, 0), InputError);
}

}  // namespace
}  // namespace morph
