// The manager's clock: every deadline it decides by (announcement, start,
// heartbeats, regroup) is read from a Clock, so its decisions can be tested
// with a fake one instead of waiting (tests/control/manager_logic_test.cpp).
#pragma once

#include "core/sys.h"

namespace morph {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds on a monotonic clock.
  virtual double now() const = 0;
};

class SystemClock : public Clock {
 public:
  double now() const override { return nowSeconds(); }
};

}  // namespace morph
