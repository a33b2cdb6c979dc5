#include "exec/schedule.h"

#include <algorithm>
#include <array>
#include <sstream>

#include "core/error.h"

namespace morph {
namespace {

constexpr size_t kNumKinds = 7;

size_t idx(ActionKind k) { return static_cast<size_t>(k); }

bool isComm(ActionKind k) {
  return k == ActionKind::kSendAct || k == ActionKind::kRecvAct || k == ActionKind::kSendGrad ||
         k == ActionKind::kRecvGrad;
}

// "rank 1, action 7 (backward vn 3): "
std::string at(size_t rank, size_t i, const Action& a) {
  std::ostringstream os;
  os << "rank " << rank << ", action " << i << " (" << toString(a) << "): ";
  return os.str();
}

[[noreturn]] void fail(size_t rank, size_t i, const Action& a, const std::string& why) {
  throw InputError("pipeline schedule: " + at(rank, i, a) + why);
}

void checkOptions(const ScheduleOptions& o) {
  if (o.stages < 1)
    throw InputError("pipeline schedule: stages must be >= 1, got " + std::to_string(o.stages));
  if (o.micro_batches < 1)
    throw InputError("pipeline schedule: micro_batches must be >= 1, got " +
                     std::to_string(o.micro_batches));
}

// Appends one VN's forward on rank k with its communication around it.
void emitForward(std::vector<Action>& out, int k, int p, int64_t vn) {
  if (k > 0) out.push_back({ActionKind::kRecvAct, vn});
  out.push_back({ActionKind::kForward, vn});
  if (k < p - 1) out.push_back({ActionKind::kSendAct, vn});
}

// Appends one VN's backward on rank k. `recompute_first` puts the Recompute
// before the wait for the gradient (Varuna) instead of after it.
void emitBackward(std::vector<Action>& out, int k, int p, int64_t vn, bool recompute,
                  bool recompute_first) {
  const bool last = k == p - 1;
  if (!last) {
    // The last stage never recomputes and receives no gradient.
    if (recompute && recompute_first) out.push_back({ActionKind::kRecompute, vn});
    out.push_back({ActionKind::kRecvGrad, vn});
    if (recompute && !recompute_first) out.push_back({ActionKind::kRecompute, vn});
  }
  out.push_back({ActionKind::kBackward, vn});
  if (k > 0) out.push_back({ActionKind::kSendGrad, vn});
}

// Runs the lists under buffered sends and blocking receives (no timing: the
// simulator in src/plan does that). Messages on a channel are paired with
// receives by their position in the channel (FIFO). Returns, per rank, how
// many actions completed (== size when the rank finished).
std::vector<size_t> runLists(const Schedule& s) {
  const size_t p = s.size();
  // act[k]: messages k -> k+1; grad[k]: messages k -> k-1; each the vn sent.
  std::vector<std::vector<int64_t>> act(p), grad(p);
  std::vector<size_t> act_taken(p, 0), grad_taken(p, 0);  // by the receiver, per sender
  std::vector<size_t> pc(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t k = 0; k < p; ++k) {
      const auto& list = s[k];
      while (pc[k] < list.size()) {
        const Action& a = list[pc[k]];
        bool done = true;
        switch (a.kind) {
          case ActionKind::kForward:
          case ActionKind::kBackward:
          case ActionKind::kRecompute: break;
          case ActionKind::kSendAct: act[k].push_back(a.vn); break;
          case ActionKind::kSendGrad: grad[k].push_back(a.vn); break;
          case ActionKind::kRecvAct:
          case ActionKind::kRecvGrad: {
            const bool is_act = a.kind == ActionKind::kRecvAct;
            // Sender: k-1 for activations, k+1 for gradients (a misplaced
            // receive past the pipeline's ends never completes).
            if (is_act ? k == 0 : k + 1 == p) {
              done = false;
              break;
            }
            const size_t from = is_act ? k - 1 : k + 1;
            auto& chan = is_act ? act[from] : grad[from];
            size_t& taken = is_act ? act_taken[from] : grad_taken[from];
            if (taken >= chan.size()) {
              done = false;
              break;
            }
            if (chan[taken] != a.vn) {
              std::ostringstream os;
              os << "rank " << from << " sent vn " << chan[taken]
                 << " at this position of the channel (sends and receives must match in order)";
              fail(k, pc[k], a, os.str());
            }
            ++taken;
            break;
          }
        }
        if (!done) break;
        ++pc[k];
        progress = true;
      }
    }
  }
  return pc;
}

// Throws naming every stuck rank and its next action.
void checkNoDeadlock(const Schedule& s, const std::vector<size_t>& pc) {
  std::ostringstream os;
  bool stuck = false;
  for (size_t k = 0; k < s.size(); ++k) {
    if (pc[k] == s[k].size()) continue;
    os << (stuck ? "; " : "") << "rank " << k << ", action " << pc[k] << " ("
       << toString(s[k][pc[k]]) << ") waits forever";
    stuck = true;
  }
  if (stuck)
    throw InputError("pipeline schedule: deadlock (buffered sends, blocking receives): " +
                     os.str());
}

std::vector<int64_t> vnsOf(const std::vector<Action>& list, ActionKind kind) {
  std::vector<int64_t> out;
  for (const auto& a : list)
    if (a.kind == kind) out.push_back(a.vn);
  return out;
}

// Rank `recv_rank`'s receives of `recv_kind` must equal rank `send_rank`'s
// sends of `send_kind`, in order.
void checkChannel(const Schedule& s, size_t send_rank, ActionKind send_kind, size_t recv_rank,
                  ActionKind recv_kind) {
  const auto sent = vnsOf(s[send_rank], send_kind);
  size_t n = 0;
  const auto& list = s[recv_rank];
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].kind != recv_kind) continue;
    if (n >= sent.size() || sent[n] != list[i].vn) {
      std::ostringstream os;
      os << "receive #" << n << " from rank " << send_rank << " expects vn " << list[i].vn
         << " but that rank's " << toString(send_kind) << " #" << n << " is ";
      if (n < sent.size())
        os << "vn " << sent[n];
      else
        os << "missing";
      os << " (sends and receives must match one to one, in order)";
      fail(recv_rank, i, list[i], os.str());
    }
    ++n;
  }
  if (n != sent.size()) {
    std::ostringstream os;
    os << "pipeline schedule: rank " << send_rank << " has " << sent.size() << " "
       << toString(send_kind) << " actions but rank " << recv_rank << " receives only " << n;
    throw InputError(os.str());
  }
}

// Per-rank order and completeness checks.
void checkRank(const std::vector<Action>& list, size_t k, const ScheduleOptions& o) {
  const size_t p = static_cast<size_t>(o.stages);
  const int64_t m = o.micro_batches;
  const bool first = k == 0, last = k + 1 == p;
  const bool recompute = o.recompute && !last;
  // first_at[vn][kind]: index of that VN's action of that kind, or -1.
  std::vector<std::array<int64_t, kNumKinds>> first_at(static_cast<size_t>(m));
  for (auto& f : first_at) f.fill(-1);
  auto seen = [&](int64_t vn, ActionKind kind) {
    return first_at[static_cast<size_t>(vn)][idx(kind)] >= 0;
  };
  auto need = [&](size_t i, const Action& a, ActionKind kind) {
    if (!seen(a.vn, kind))
      fail(k, i, a, "no " + toString(kind) + " of vn " + std::to_string(a.vn) + " before it");
  };

  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.vn < 0 || a.vn >= m)
      fail(k, i, a, "vn outside 0.." + std::to_string(m - 1));
    if (first && (a.kind == ActionKind::kRecvAct || a.kind == ActionKind::kSendGrad))
      fail(k, i, a, "rank 0 has no previous stage");
    if (last && (a.kind == ActionKind::kSendAct || a.kind == ActionKind::kRecvGrad))
      fail(k, i, a, "the last rank has no next stage");
    if (a.kind == ActionKind::kRecompute && !o.recompute)
      fail(k, i, a, "recomputation is off");
    if (a.kind == ActionKind::kRecompute && last)
      fail(k, i, a, "the last stage never recomputes (it runs each backward right after its forward)");
    const int64_t prev = first_at[static_cast<size_t>(a.vn)][idx(a.kind)];
    if (prev >= 0)
      fail(k, i, a, "duplicated: vn " + std::to_string(a.vn) + " already has a " +
                        toString(a.kind) + " at action " + std::to_string(prev));
    switch (a.kind) {
      case ActionKind::kForward:
        if (!first) need(i, a, ActionKind::kRecvAct);
        break;
      case ActionKind::kSendAct:
      case ActionKind::kRecompute:
        need(i, a, ActionKind::kForward);
        break;
      case ActionKind::kBackward:
        need(i, a, ActionKind::kForward);
        if (!last) need(i, a, ActionKind::kRecvGrad);
        if (recompute) need(i, a, ActionKind::kRecompute);
        break;
      case ActionKind::kSendGrad:
        need(i, a, ActionKind::kBackward);
        break;
      case ActionKind::kRecvAct:
      case ActionKind::kRecvGrad:
        // Causality across ranks (the message must have been sent) is left to
        // the deadlock simulation.
        break;
    }
    first_at[static_cast<size_t>(a.vn)][idx(a.kind)] = static_cast<int64_t>(i);
  }

  std::vector<ActionKind> required = {ActionKind::kForward, ActionKind::kBackward};
  if (!first) required.insert(required.end(), {ActionKind::kRecvAct, ActionKind::kSendGrad});
  if (!last) required.insert(required.end(), {ActionKind::kSendAct, ActionKind::kRecvGrad});
  if (recompute) required.push_back(ActionKind::kRecompute);
  for (int64_t vn = 0; vn < m; ++vn)
    for (ActionKind kind : required)
      if (!seen(vn, kind))
        throw InputError("pipeline schedule: rank " + std::to_string(k) + ": missing " +
                         toString(Action{kind, vn}) + " (every VN runs once on every stage, " +
                         "with its communication)");
}

void checkLiveBound(const std::vector<Action>& list, size_t k, int64_t bound) {
  std::vector<int64_t> live_vns;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.kind == ActionKind::kForward) {
      live_vns.push_back(a.vn);
      if (static_cast<int64_t>(live_vns.size()) > bound)
        fail(k, i, a, std::to_string(live_vns.size()) + " activations stashed at once, above " +
                          "the bound of " + std::to_string(bound));
    } else if (a.kind == ActionKind::kBackward) {
      auto it = std::find(live_vns.begin(), live_vns.end(), a.vn);
      if (it != live_vns.end()) live_vns.erase(it);
    }
  }
}

// Does `a` need `b` to have run before it on the same rank?
bool dependsOn(const Action& a, const Action& b) {
  if (a.vn != b.vn) return false;
  switch (a.kind) {
    case ActionKind::kForward: return b.kind == ActionKind::kRecvAct;
    case ActionKind::kSendAct:
    case ActionKind::kRecompute: return b.kind == ActionKind::kForward;
    case ActionKind::kBackward:
      return b.kind == ActionKind::kForward || b.kind == ActionKind::kRecvGrad ||
             b.kind == ActionKind::kRecompute;
    case ActionKind::kSendGrad: return b.kind == ActionKind::kBackward;
    case ActionKind::kRecvGrad: return b.kind == ActionKind::kSendAct;
    case ActionKind::kRecvAct: return false;
  }
  return false;
}

}  // namespace

Schedule makeSchedule(const ScheduleOptions& o) {
  checkOptions(o);
  const int p = o.stages;
  const int64_t m = o.micro_batches;
  const bool recompute_first = o.kind == ScheduleKind::kVaruna;
  Schedule s(static_cast<size_t>(p));
  for (int k = 0; k < p; ++k) {
    auto& out = s[static_cast<size_t>(k)];
    auto fwd = [&](int64_t vn) { emitForward(out, k, p, vn); };
    auto bwd = [&](int64_t vn) { emitBackward(out, k, p, vn, o.recompute, recompute_first); };
    if (o.kind == ScheduleKind::kGpipe) {
      for (int64_t vn = 0; vn < m; ++vn) fwd(vn);
      for (int64_t vn = m - 1; vn >= 0; --vn) bwd(vn);
    } else {
      // 1F1B and Varuna: w warm-up forwards fill the pipeline below rank k;
      // the steady state keeps w + 1 VNs live; the cool-down drains them.
      const int64_t warmup = std::min<int64_t>(p - k - 1, m);
      for (int64_t vn = 0; vn < warmup; ++vn) fwd(vn);
      for (int64_t i = 0; i < m - warmup; ++i) {
        fwd(warmup + i);
        bwd(i);
      }
      for (int64_t vn = m - warmup; vn < m; ++vn) bwd(vn);
    }
  }
  return s;
}

void validateSchedule(const Schedule& s, const ScheduleOptions& o, int64_t max_live_activations) {
  checkOptions(o);
  if (s.size() != static_cast<size_t>(o.stages))
    throw InputError("pipeline schedule: " + std::to_string(s.size()) + " rank lists for " +
                     std::to_string(o.stages) + " stages");
  for (size_t k = 0; k < s.size(); ++k) checkRank(s[k], k, o);
  for (size_t k = 0; k + 1 < s.size(); ++k) {
    checkChannel(s, k, ActionKind::kSendAct, k + 1, ActionKind::kRecvAct);
    checkChannel(s, k + 1, ActionKind::kSendGrad, k, ActionKind::kRecvGrad);
  }
  if (max_live_activations > 0)
    for (size_t k = 0; k < s.size(); ++k) checkLiveBound(s[k], k, max_live_activations);
  checkNoDeadlock(s, runLists(s));
}

std::string toString(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward: return "forward";
    case ActionKind::kBackward: return "backward";
    case ActionKind::kRecompute: return "recompute";
    case ActionKind::kSendAct: return "send activation";
    case ActionKind::kRecvAct: return "recv activation";
    case ActionKind::kSendGrad: return "send grad";
    case ActionKind::kRecvGrad: return "recv grad";
  }
  return "unknown";
}

std::string toString(const Action& a) { return toString(a.kind) + " vn " + std::to_string(a.vn); }

std::string toString(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kVaruna: return "varuna";
  }
  return "unknown";
}

ScheduleKind parseScheduleKind(const std::string& name) {
  for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kVaruna})
    if (toString(k) == name) return k;
  throw InputError("unknown pipeline schedule '" + name + "' (expected gpipe, 1f1b or varuna)");
}

int64_t peakLiveActivations(const std::vector<Action>& list) {
  std::vector<int64_t> live_vns;
  int64_t peak = 0;
  for (const auto& a : list) {
    if (a.kind == ActionKind::kForward) {
      live_vns.push_back(a.vn);
      peak = std::max<int64_t>(peak, static_cast<int64_t>(live_vns.size()));
    } else if (a.kind == ActionKind::kBackward) {
      auto it = std::find(live_vns.begin(), live_vns.end(), a.vn);
      if (it != live_vns.end()) live_vns.erase(it);
    }
  }
  return peak;
}

bool canSwap(const std::vector<Action>& actions, size_t i, size_t j) {
  MORPH_CHECK(i <= j && j < actions.size(), "canSwap needs i <= j < actions.size()");
  const Action& a = actions[j];
  for (size_t m = i; m < j; ++m) {
    const Action& b = actions[m];
    if (dependsOn(a, b)) return false;
    if (isComm(a.kind) && a.kind == b.kind) return false;  // keeps channel order
  }
  return true;
}

double bubbleFraction(int stages, int64_t micro_batches) {
  ScheduleOptions o;
  o.stages = stages;
  o.micro_batches = micro_batches;
  checkOptions(o);
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

int64_t stashedVns(const ScheduleOptions& o, int rank) {
  checkOptions(o);
  MORPH_CHECK(0 <= rank && rank < o.stages, "rank outside the pipeline");
  if (o.kind == ScheduleKind::kGpipe) return o.micro_batches;
  return std::min<int64_t>(o.stages - rank, o.micro_batches);
}

int64_t runStashBound(const ScheduleOptions& o, int rank) {
  const int64_t s = stashedVns(o, rank);
  if (o.kind != ScheduleKind::kVaruna || rank + 1 == o.stages) return s;
  return std::min<int64_t>(s + 1, o.micro_batches);
}

size_t opportunisticMove(const std::vector<Action>& actions, size_t i,
                         const std::function<bool(const Action&)>& arrived, int64_t max_stashed) {
  MORPH_CHECK(i < actions.size(), "opportunisticMove needs i < actions.size()");
  // What actions[0..i) left live: every backward follows its forward and,
  // with recomputation, its recompute, so the differences of the counts are
  // the stashed VNs and the recomputed VNs waiting for their backward.
  int64_t forwards = 0, backwards = 0, recomputes = 0;
  for (size_t m = 0; m < i; ++m) {
    const ActionKind k = actions[m].kind;
    forwards += k == ActionKind::kForward;
    backwards += k == ActionKind::kBackward;
    recomputes += k == ActionKind::kRecompute;
  }
  const int64_t stashed = forwards - backwards;
  const bool recomputed_live = recomputes > backwards;  // recomputation on: one per backward
  const size_t end = std::min(actions.size(), i + 1 + kVarunaLookAhead);
  for (size_t j = i + 1; j < end; ++j) {
    const Action& c = actions[j];
    const bool input_here = c.kind == ActionKind::kForward || c.kind == ActionKind::kSendAct ||
                            c.kind == ActionKind::kRecompute ||
                            ((c.kind == ActionKind::kRecvAct || c.kind == ActionKind::kRecvGrad) && arrived(c));
    const bool fits = c.kind == ActionKind::kForward     ? stashed < max_stashed
                      : c.kind == ActionKind::kRecompute ? !recomputed_live
                                                         : true;
    if (input_here && fits && canSwap(actions, i, j)) return j;
  }
  return i;
}

}  // namespace morph
