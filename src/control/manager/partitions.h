// Partitions: members that cannot reach each other although each still
// reaches the manager (docs/distributed.md, "Partitions"). A member whose
// collective has not progressed past its deadline probes its peers and
// reports the ones it cannot reach (ReachReport, workers/<id>/reach). From
// those reports the manager keeps the largest group whose members can all
// reach each other and sets the others aside: they are not killed, they
// wait as joiners and are admitted again once they report that they reach
// every member of the current generation. Decisions read the store only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace morph {

// The largest subset of `members` whose members can all reach each other.
// `unreachable[id]`: the peers `id` reported it cannot reach; a pair is cut
// when either side reports the other. Ties: the larger summed speed
// (`speed[id]`, 1 when absent), then the lowest ids (the sorted ids compared
// in order). Returns the group in the order of `members`.
std::vector<int64_t> largestReachableGroup(const std::vector<int64_t>& members,
                                           const std::map<int64_t, std::vector<int64_t>>& unreachable,
                                           const std::map<int64_t, double>& speed = {});

class Partitions {
 public:
  // What the members of generation `gen` reported: the group to keep and
  // the members to set aside, when some member cannot reach another (once
  // per generation and split: later reports of the same generation are
  // looked at again only if they cut more).
  struct Split {
    std::vector<int64_t> keep, aside;
    std::string describe;  // who cannot reach whom, for the manager's output
  };
  // The first report of a cut in a generation is not acted on at once: the
  // members on the other side of it probe within about a second too, and a
  // decision made on one side's report alone may keep a group that the
  // next report cuts again. poll waits kSettleS (`now`: the manager's
  // clock) from the first such report, then decides on all of them.
  static constexpr double kSettleS = 2.0;
  std::optional<Split> poll(c10d::Store& store, int64_t gen, const std::vector<int64_t>& members,
                            const std::map<int64_t, double>& speed, double now);
  // Workers set aside whose latest report says they reach every member of
  // generation `gen`: no longer aside (returned, to be printed).
  std::vector<int64_t> readmit(c10d::Store& store, int64_t gen);
  bool aside(int64_t id) const { return aside_.count(id) > 0; }
  const std::set<int64_t>& asideSet() const { return aside_; }
  // A worker that died or left is forgotten.
  void forget(int64_t id) { aside_.erase(id); }

 private:
  std::set<int64_t> aside_;
  int64_t acted_gen_ = -1;
  size_t acted_cuts_ = 0;  // cut pairs the last split of acted_gen_ was made from
  int64_t seen_gen_ = -1;   // the generation of the first cut report seen, and when
  double seen_at_ = 0;
};

}  // namespace morph
