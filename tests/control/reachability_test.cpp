// Reachability probes (src/control/worker/reachability.h) on loopback: a
// listener answers; a closed port's refusal counts only when asked (before
// the deadline it may be a dead worker); malformed addresses do not
// answer, and an address nobody answers is given up at the timeout.
#include <gtest/gtest.h>

#include "control/worker/reachability.h"
#include "core/error.h"

namespace morph {
namespace {

TEST(Reachability, ListenerAnswersOthersDoNot) {
  ProbeListener a("127.0.0.1"), b("127.0.0.1");
  std::string closed;
  {
    ProbeListener gone("127.0.0.1");
    closed = gone.address();
  }  // its port now refuses: a dead worker, which is a failure, not a partition
  const std::vector<std::string> addrs = {a.address(), closed, b.address(), "127.0.0.1", "nohost:80", "127.0.0.1:0"};
  EXPECT_EQ(unreachable(addrs, /*refused_counts=*/false, 1.0), std::vector<size_t>({3, 4, 5}));
  EXPECT_EQ(unreachable(addrs, /*refused_counts=*/true, 1.0), std::vector<size_t>({1, 3, 4, 5}));
  EXPECT_TRUE(unreachable({a.address(), b.address(), a.address()}, true, 1.0).empty());  // probed again: still answers
  EXPECT_THROW(ProbeListener("not-an-address"), InputError);
}

// A TEST-NET address (RFC 5737) nobody answers: unreachable once the
// timeout passes, or sooner where it is unroutable or (this sandbox's
// firewall) rejected.
TEST(Reachability, SilentPeerIsUnreachable) {
  ProbeListener a("127.0.0.1");
  EXPECT_EQ(unreachable({"192.0.2.1:9", a.address()}, true, 0.3), std::vector<size_t>({0}));
}

}  // namespace
}  // namespace morph
