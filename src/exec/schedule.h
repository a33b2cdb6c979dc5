// Pipeline-parallel schedules: for each pipeline rank, the ordered list of
// actions it runs in one step, plus a validator. Timing lives in src/plan.
//
// A model is cut into P stages; stage k runs on pipeline rank k. One step
// pushes M micro-batches through the pipeline; a micro-batch *is* a VN
// (indexed 0..M-1), never split or merged. This file is pure logic: it knows
// nothing of tensors or communicators, and the stage executor must run the
// lists exactly as given (or reorder them only where canSwap() allows).
//
// Communication model (used by the validator): sends are
// buffered, so a send completes at once and never blocks; receives block
// until the matching send has been posted. Activations flow k -> k+1, gradients
// k+1 -> k, each over one FIFO channel per neighbour pair and direction, so
// rank k's SendAct sequence must equal rank k+1's RecvAct sequence (and rank
// k+1's SendGrad sequence rank k's RecvGrad sequence).
//
// Activation recomputation (ScheduleOptions::recompute): every stage but the
// last stashes only its input per VN and runs Recompute(vn) (the forward
// again, with the VN's own reseeded randomness) before Backward(vn). The last
// stage never recomputes (as Varuna): under 1F1B and Varuna it runs each
// backward straight after its forward, so its activations are live only
// briefly; under GPipe it still holds all M VNs' activations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace morph {

enum class ScheduleKind {
  // All forwards, then all backwards (in reverse VN order, M-1..0, as GPipe
  // and autograd-driven pipelines do). Peak live activations per rank: M.
  kGpipe,
  // PipeDream-flush / Megatron non-interleaved: rank k runs
  // w = min(P-k-1, M) warm-up forwards, then alternates one forward and one
  // backward, then the cool-down backwards. Peak live activations: min(P-k, M).
  k1F1B,
  // Varuna: the 1F1B order (the last stage does forward then backward for
  // each VN), with recomputation placed *before* the wait for the gradient
  // (Recompute, RecvGrad, Backward) so that it overlaps that wait; GPipe and
  // 1F1B recompute inside the backward, after the gradient has arrived
  // (RecvGrad, Recompute, Backward). At run time the executor may take
  // Varuna's opportunistic choice, running a ready Forward ahead of a
  // Backward whose gradient has not arrived, by moving actions only where
  // canSwap() allows and only when the moved action's inputs have already
  // arrived (a receive whose message is there cannot block, so no deadlock
  // can be introduced). A move never holds more than runStashBound() VNs
  // stashed (one forward beyond the static schedule's) nor two recomputed
  // VNs at once (Varuna's rule), so memory estimates count that bound.
  kVaruna,
};

enum class ActionKind {
  kForward,
  kBackward,
  kRecompute,  // re-run the forward of vn from its stashed stage input
  kSendAct,    // to rank + 1
  kRecvAct,    // from rank - 1
  kSendGrad,   // to rank - 1
  kRecvGrad,   // from rank + 1
};

struct Action {
  ActionKind kind;
  int64_t vn;
  bool operator==(const Action& o) const { return kind == o.kind && vn == o.vn; }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

// Messages the stage executor receives ahead of use, per incoming channel
// (its receiver thread posts the next receive only while fewer wait unused).
constexpr size_t kRecvWindow = 2;

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int stages = 1;              // P >= 1
  int64_t micro_batches = 1;   // M >= 1 (VNs per pipeline per step)
  bool recompute = false;
};

using Schedule = std::vector<std::vector<Action>>;  // [rank] -> actions, in order

// Throws InputError when stages < 1 or micro_batches < 1. The result always
// passes validateSchedule().
Schedule makeSchedule(const ScheduleOptions& opts);

// Throws InputError, naming the rank, the action index and the action
// ("rank 1, action 7 (backward vn 3): no forward of vn 3 before it"), when:
// the number of rank lists is not opts.stages; an action is out of place for
// its rank (a send/recv past the ends of the pipeline, a vn outside 0..M-1, a
// Recompute when recomputation is off or on the last stage); a VN's actions
// are missing or duplicated; a backward precedes its forward, its RecvGrad
// (rank < P-1) or its Recompute (recompute on, rank < P-1); a forward on rank
// > 0 lacks its RecvAct before it; a send precedes the compute it sends; sends
// and receives between neighbours do not match one to one in order; more than
// max_live_activations VNs are stashed at once on a rank (when > 0; see
// peakLiveActivations); or the schedule deadlocks under buffered sends and
// blocking receives (the message names every stuck rank and its next action).
void validateSchedule(const Schedule& schedule, const ScheduleOptions& opts,
                      int64_t max_live_activations = 0);

std::string toString(ActionKind kind);     // "recv grad"
std::string toString(const Action& a);     // "forward vn 3"
std::string toString(ScheduleKind kind);   // "gpipe" | "1f1b" | "varuna"
ScheduleKind parseScheduleKind(const std::string& name);  // InputError if unknown

// The most VNs whose activations are stashed at once on one rank: forwarded
// but not yet backwarded. With recomputation a VN stashes only its stage
// input; it still counts as one unit (the caller knows the unit's size).
int64_t peakLiveActivations(const std::vector<Action>& rank_actions);
// The same for rank k of makeSchedule(opts) without generating it (the
// planner asks for millions): M under GPipe, min(P - k, M) under 1F1B and
// Varuna (before Varuna's run-time moves). Tested against the generator.
int64_t stashedVns(const ScheduleOptions& opts, int rank);
// The most VNs rank k may hold stashed at run time, Varuna's moves included:
// stashedVns(), except under Varuna on a rank that receives gradients (every
// rank but the last), where opportunisticMove() may run one forward beyond
// the static schedule's while it waits: min(P - k + 1, M). Memory estimates
// (--memory-cap, the planner, the simulator) count this bound.
int64_t runStashBound(const ScheduleOptions& opts, int rank);

// Whether moving actions[j] to just before actions[i] (i <= j < size; the
// actions in between shift one place later) keeps the rank's list valid:
// actions[j] depends on none of actions[i..j-1] (forward on its RecvAct,
// Recompute and SendAct on the forward, backward on its forward, RecvGrad and
// Recompute, SendGrad on the backward, RecvGrad on the SendAct of its vn), and
// it passes no action on the same channel (that would break the in-order
// matching with the neighbour). Does not look at memory.
bool canSwap(const std::vector<Action>& actions, size_t i, size_t j);

// Idle fraction of each rank in an ideal pipeline with t_bwd a fixed multiple
// of t_fwd and free communication: (P-1)/(M+P-1).
double bubbleFraction(int stages, int64_t micro_batches);

// Varuna's opportunistic choice, shared by the stage executor and the
// simulator (src/plan/simulator.h): at action i, a receive of a gradient that
// has not arrived yet, the first later action j that canSwap() lets move
// ahead of it and whose input is already here (a receive whose message
// `arrived`; a forward, recompute or activation send always), or i when
// there is none. The caller moves actions[j] to position i. It looks at
// most kVarunaLookAhead actions ahead (the next few forwards are what can
// usefully fill the wait; a longer scan costs O(list) per wait).
//
// Memory: actions[0..i) are taken as done. A forward moves only while fewer
// than `max_stashed` VNs are stashed (forwarded, not yet backwarded; pass
// runStashBound()), and a recompute only while no other recomputed VN waits
// for its backward (Varuna's rule: one VN's recomputed activations at a
// time). Without these limits a late gradient let a rank pile up forwards
// and recomputes (up to M stashed, two recomputed VNs) beyond every estimate.
constexpr size_t kVarunaLookAhead = 32;
size_t opportunisticMove(const std::vector<Action>& actions, size_t i,
                         const std::function<bool(const Action&)>& arrived, int64_t max_stashed);

}  // namespace morph
