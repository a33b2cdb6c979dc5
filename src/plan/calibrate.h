// Calibration: measures what a job's plans are made of, once, on this
// machine (docs/profile_format.md). Two halves:
//  - measureCompute(): in this process, per layer at the job's VN size:
//    forward (with and without autograd), backward (with the fixed-point
//    quantisation of its gradients), recompute, activation and state sizes;
//    the optimiser step per parameter.
//  - measureComm(): on a 2-rank communicator (this process and a peer
//    process over Gloo, the executor's path): one-way send/recv, int64 and
//    float32 SUM and float64 MAX all-reduces, each fitted to a line in bytes.
//    Both ranks call it with the same arguments; rank 0's profile gets the
//    fits.
// It never plans and never talks to the control plane.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/job_spec.h"
#include "data/dataset.h"
#include "plan/profile.h"

namespace morph {

// Progress lines ("layer 3/5 (fc): ...") for a person who waits.
using ProgressFn = std::function<void(const std::string&)>;

// Fills everything but the communication fits. `budget_s` bounds the time
// spent in rounds over every layer (at least 7 rounds are kept).
// `whole_s` (optional) gets the whole model's time the layers were scaled
// to (one VN's forward and backward, the robust median over the rounds).
Profile measureCompute(const JobSpec& job, const Dataset& train, double budget_s, const ProgressFn& progress,
                       double* whole_s = nullptr);

// One VN of the job's whole model, forward and backward, timed in this
// process as measureCompute() times it, again and again over a
// calibration (after the communication, after each co-located run): the
// layer profile is scaled to the median of these (plan/contention.h,
// wholeModelSeconds()).
class WholeModelTimer {
 public:
  WholeModelTimer(const JobSpec& job, const Dataset& train);
  // The robust median of at least 7 VNs after a warm-up, more while within
  // `budget_s` (at most 60).
  double time(double budget_s);

 private:
  JobSpec job_;
  std::shared_ptr<struct WholeModelState> state_;
};

// Message sizes worth measuring for `profile`: its cut sizes and powers of 4
// around them (bytes, sorted, unique).
std::vector<int64_t> p2pSizes(const Profile& profile);
std::vector<int64_t> allreduceSizes(const Profile& profile);

// Both ranks of `comm` (size 2) call it with the same sizes; rank 0 stores
// the fits in `*profile` (rank 1 may pass nullptr).
void measureComm(Communicator& comm, const std::vector<int64_t>& p2p_bytes,
                 const std::vector<int64_t>& allreduce_bytes, Profile* profile, const ProgressFn& progress);

// Both ranks of `comm` (size 2, one host) call it: rank 0 computes
// `rounds` VNs of the whole model alone, then both ranks compute `rounds`
// at the same time; rank 0 returns the ratio of the medians (>= 1):
// Profile::compute_contention.
double measureContention(const JobSpec& job, const Dataset& train, Communicator& comm, int rounds);

}  // namespace morph
