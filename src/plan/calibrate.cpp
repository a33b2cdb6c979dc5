#include "plan/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "core/sys.h"
#include "exec/fixed_point.h"
#include "exec/grad_accumulator.h"
#include "exec/optimizer.h"
#include "exec/trainer.h"
#include "models/loss.h"
#include "models/model.h"

namespace morph {

namespace {

constexpr int kMinRuns = 5, kMaxRuns = 25;
constexpr int kMinRounds = 7, kMaxRounds = 60;

// The median of the runs once the slowest quarter (pre-emption, page
// faults of a first touch) is dropped.
double robustMedian(std::vector<double> v) {
  MORPH_CHECK(!v.empty(), "no runs");
  std::sort(v.begin(), v.end());
  v.resize(v.size() - v.size() / 4);
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs `fn` (which returns the seconds of the part it times) at least
// `min_runs` times after one warm-up, and more (up to `max_runs`) while
// within `budget_s`; the robust median of the runs.
double timeRuns(double budget_s, const std::function<double()>& fn, int min_runs = kMinRuns,
                int max_runs = kMaxRuns) {
  fn();
  std::vector<double> runs;
  const double t0 = nowSeconds();
  while (runs.size() < static_cast<size_t>(min_runs) ||
         (runs.size() < static_cast<size_t>(max_runs) && nowSeconds() - t0 < budget_s))
    runs.push_back(fn());
  return robustMedian(runs);
}

int64_t bytesOf(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// The job's summed loss plus the statistics the executor reads: what the
// last stage computes after its forward.
torch::Tensor lossOf(const ModelSpec& m, const torch::Tensor& out, const torch::Tensor& y) {
  torch::Tensor loss = lossSum(m, out, y);
  torch::NoGradGuard no_grad;
  (void)loss.item<float>();
  (void)correctPredictions(m, out, y);
  return loss;
}

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  return buf;
}

}  // namespace

Profile measureCompute(const JobSpec& job, const Dataset& train, double budget_s, const ProgressFn& progress,
                       double* whole_out) {
  Profile p;
  p.runtime_bytes = currentRssBytes();
  auto model = buildModel(job.model, job.seed);
  model->train();
  const size_t L = model->size();
  std::vector<std::string> names;
  for (size_t l = 0; l < L; ++l) names.push_back(model->layerName(l));
  p.fingerprint = jobFingerprint(job, names);
  p.host_cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  const Batch batch = train.range(0, job.vnSize());
  p.input_bytes = bytesOf(batch.x);
  // Each layer's input for one VN (its predecessors run without autograd).
  std::vector<torch::Tensor> ins{batch.x};
  {
    torch::NoGradGuard no_grad;
    for (size_t l = 0; l < L; ++l) ins.push_back(model->forwardRange(ins.back(), l, l + 1));
  }
  const int64_t state_copies = job.optim.name == "adamw" ? 2 : job.optim.momentum > 0 ? 1 : 0;
  const uint64_t seed = 0x5eed;

  // Quantising one value into the fixed-point buffer (the executor does it
  // for every gradient value of every VN, inside the backward).
  {
    const int64_t n = 1 << 20;
    GradAccumulator acc({n}, job.reduce_mode, job.headroom_bits);
    torch::Tensor g = torch::randn({n}) * 1e-3;
    acc.beginStep();
    p.quantize_s_per_value = timeRuns(0.3, [&] {
      const double t0 = nowSeconds();
      acc.add(0, g.data_ptr<float>());
      return nowSeconds() - t0;
    }) / static_cast<double>(n);
  }

  const auto params = model->parameters();
  auto layerOf = [&](const torch::Tensor& t) {
    for (size_t k = 0; k < L; ++k)
      for (const auto& q : model->layer(k).parameters())
        if (q.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return static_cast<int>(k);
    return -1;
  };
  for (size_t l = 0; l < L; ++l) {
    Layer& layer = model->layer(l);
    LayerCost c;
    c.name = names[l];
    for (const auto& q : layer.parameters()) c.params += q.numel(), c.param_bytes += bytesOf(q);
    for (const auto& b : layer.buffers()) c.buffer_bytes += bytesOf(b);
    c.optimizer_bytes = state_copies * c.param_bytes;
    for (auto& [alias, owner] : layer.tiedLeaves()) {
      c.tied_params += owner.numel();
      c.tied_owner = layerOf(owner);
    }
    for (const auto& m : layer.modules(/*include_self=*/true))
      if (auto* bn = dynamic_cast<VnBatchNorm*>(m.get())) c.bn_values += 2 * bn->channels();
    c.output_bytes = bytesOf(ins[l + 1]);
    p.layers.push_back(c);
  }
  auto input = [&](size_t l) {
    torch::Tensor in = ins[l].detach();
    if (l > 0 && in.is_floating_point()) in.requires_grad_(true);
    return in;
  };
  auto forward = [&](size_t l, const torch::Tensor& in) {
    torch::Tensor out = model->forwardRange(in, l, l + 1, seed);
    return l + 1 == L ? lossOf(job.model, out, batch.y) : out;
  };
  std::vector<torch::Tensor> grad_out;
  for (size_t l = 0; l + 1 < L; ++l) grad_out.push_back(torch::full_like(ins[l + 1], 1e-3));
  auto clearGrads = [&] {
    for (const auto& q : params) q.mutable_grad() = torch::Tensor();
  };
  // Rounds over every layer and the whole model, so that a slow moment of
  // a shared machine touches every figure alike; each figure is the robust
  // median over rounds.
  std::vector<std::vector<double>> fwd(L), bwd(L), rec(L), nograd(L);
  std::vector<double> whole;
  const double t_start = nowSeconds();
  for (int round = -1; round < kMaxRounds; ++round) {  // round -1 warms up
    if (round >= kMinRounds && nowSeconds() - t_start > budget_s) break;
    for (size_t l = 0; l < L; ++l) {
      torch::Tensor in = input(l);
      double t0 = nowSeconds();
      torch::Tensor out = forward(l, in);
      const double f = nowSeconds() - t0;
      double b = 0;
      if (out.requires_grad()) {
        t0 = nowSeconds();
        if (l + 1 == L) out.backward(); else out.backward(grad_out[l]);
        b = nowSeconds() - t0;
      }
      clearGrads();
      in = input(l);
      t0 = nowSeconds();
      torch::Tensor again = model->forwardRange(in, l, l + 1, seed);
      const double r = nowSeconds() - t0;
      double n = 0;
      {
        torch::NoGradGuard no_grad;
        t0 = nowSeconds();
        torch::Tensor o = model->forwardRange(ins[l], l, l + 1, seed);
        n = nowSeconds() - t0;
      }
      if (round >= 0) fwd[l].push_back(f), bwd[l].push_back(b), rec[l].push_back(r), nograd[l].push_back(n);
    }
    const double t0 = nowSeconds();
    lossOf(job.model, model->forwardRange(batch.x, 0, L, seed), batch.y).backward();
    if (round >= 0) whole.push_back(nowSeconds() - t0);
    clearGrads();
  }
  for (size_t l = 0; l < L; ++l) {
    LayerCost& c = p.layers[l];
    c.forward_s = robustMedian(fwd[l]);
    c.backward_s = robustMedian(bwd[l]);
    c.recompute_s = robustMedian(rec[l]);
    c.forward_nograd_s = robustMedian(nograd[l]);
    torch::Tensor in = input(l);
    const int64_t before = allocatorBytesInUse();
    torch::Tensor out = forward(l, in);
    c.activation_bytes = std::max<int64_t>(allocatorBytesInUse() - before, 0);
    if (progress)
      progress("layer " + std::to_string(l + 1) + "/" + std::to_string(L) + " (" + c.name + "): forward " +
               ms(c.forward_s) + ", backward " + ms(c.backward_s) + ", output " + std::to_string(c.output_bytes) +
               " bytes");
  }

  // Layers timed one by one pay a little per call that a whole pass does
  // not (and miss what runs between them): scale them so that they add up
  // to one VN's measured forward and backward through the whole model.
  const double whole_s = robustMedian(whole);
  if (whole_out) *whole_out = whole_s;
  double parts = 0;
  for (const LayerCost& c : p.layers) parts += c.forward_s + c.backward_s;
  const double scale = parts > 0 ? whole_s / parts : 1.0;
  for (LayerCost& c : p.layers) {
    c.forward_s *= scale, c.backward_s *= scale, c.recompute_s *= scale, c.forward_nograd_s *= scale;
    c.backward_s += p.quantize_s_per_value * static_cast<double>(c.params + c.tied_params);
  }
  if (progress)
    progress("whole model: forward + backward " + ms(whole_s) + " per VN over " + std::to_string(whole.size()) +
             " rounds (layers scaled by " + std::to_string(scale).substr(0, 5) + ")");

  // The optimiser step and reading the mean gradient out of the buffer,
  // per parameter value.
  {
    int64_t n = 0;
    for (const auto& q : params) {
      q.mutable_grad() = torch::full_like(q, 1e-4);
      n += q.numel();
    }
    auto opt = makeOptimizer(job.optim, params);
    GradAccumulator acc({std::max<int64_t>(n, 1)}, job.reduce_mode, job.headroom_bits);
    std::vector<float> out(static_cast<size_t>(std::max<int64_t>(n, 1)));
    acc.beginStep();
    const double step = timeRuns(0.5, [&] {
      const double t0 = nowSeconds();
      acc.read(0, 1.0, out.data());
      opt->step(1e-6);
      return nowSeconds() - t0;
    });
    p.optimizer_s_per_param = n > 0 ? step / static_cast<double>(n) : 0.0;
  }
  return p;
}

struct WholeModelState {
  std::shared_ptr<LayerList> model;
  Batch batch;
  std::vector<torch::Tensor> params;
};

WholeModelTimer::WholeModelTimer(const JobSpec& job, const Dataset& train)
    : job_(job), state_(std::make_shared<WholeModelState>()) {
  state_->model = buildModel(job.model, job.seed);
  state_->model->train();
  state_->batch = train.range(0, job.vnSize());
  state_->params = state_->model->parameters();
}

double WholeModelTimer::time(double budget_s) {
  WholeModelState& s = *state_;
  auto vn = [&] {
    const double t0 = nowSeconds();
    lossOf(job_.model, s.model->forwardRange(s.batch.x, 0, s.model->size(), 0x5eed), s.batch.y).backward();
    const double t = nowSeconds() - t0;
    for (const auto& q : s.params) q.mutable_grad() = torch::Tensor();
    return t;
  };
  return timeRuns(budget_s, vn, kMinRounds, kMaxRounds);  // after one warm-up VN
}

double measureContention(const JobSpec& job, const Dataset& train, Communicator& comm, int rounds) {
  auto model = buildModel(job.model, job.seed);
  model->train();
  const Batch batch = train.range(0, job.vnSize());
  const auto params = model->parameters();
  auto vn = [&] {
    const double t0 = nowSeconds();
    lossOf(job.model, model->forwardRange(batch.x, 0, model->size(), 0x5eed), batch.y).backward();
    const double t = nowSeconds() - t0;
    for (const auto& q : params) q.mutable_grad() = torch::Tensor();
    return t;
  };
  vn();  // warm-up
  double go = 1;
  // Alone (the peer waits in the next all-reduce), then together, back to
  // back, so that a slow spell of a shared machine touches both alike.
  std::vector<double> alone, together;
  comm.allreduceMax(&go, 1);
  if (comm.rank() == 0)
    for (int r = 0; r < rounds; ++r) alone.push_back(vn());
  comm.allreduceMax(&go, 1);
  for (int r = 0; r < rounds; ++r) together.push_back(vn());
  comm.allreduceMax(&go, 1);
  if (comm.rank() != 0) return 1.0;
  return std::max(1.0, robustMedian(together) / robustMedian(alone));
}

std::vector<int64_t> p2pSizes(const Profile& p) {
  std::set<int64_t> s;
  for (size_t l = 0; l + 1 < p.layers.size(); ++l)
    if (p.layers[l].output_bytes > 0) s.insert(std::min<int64_t>(p.layers[l].output_bytes, int64_t{64} << 20));
  for (int64_t b = 4096; b <= (int64_t{4} << 20); b *= 4) s.insert(b);
  return {s.begin(), s.end()};
}

std::vector<int64_t> allreduceSizes(const Profile& p) {
  std::set<int64_t> s{64, 64 << 10, 1 << 20, 4 << 20};
  const int64_t model = std::min<int64_t>(p.totalParams() * 8, int64_t{25} << 20);
  if (model > 64) s.insert(model);
  return {s.begin(), s.end()};
}

void measureComm(Communicator& comm, const std::vector<int64_t>& p2p_bytes,
                 const std::vector<int64_t>& allreduce_bytes, Profile* profile, const ProgressFn& progress) {
  MORPH_CHECK_EQ(comm.size(), 2);
  const int me = comm.rank(), peer = 1 - me;
  // Both ranks run the same fixed number of repetitions.
  auto reps = [](int64_t bytes) { return bytes <= (int64_t{1} << 20) ? 12 : 6; };
  std::vector<std::pair<double, double>> p2p;
  for (int64_t bytes : p2p_bytes) {
    torch::Tensor t = torch::zeros({std::max<int64_t>(bytes / 4, 1)});
    std::vector<double> runs;
    for (int r = 0; r < reps(bytes) + 1; ++r) {
      const double t0 = nowSeconds();
      if (me == 0) {
        comm.send(t, peer, 7)->wait();
        comm.recv(t, peer, 8)->wait();
      } else {
        comm.recv(t, peer, 7)->wait();
        comm.send(t, peer, 8)->wait();
      }
      if (r > 0) runs.push_back((nowSeconds() - t0) / 2);  // one way: half the round trip
    }
    p2p.push_back({static_cast<double>(bytes), robustMedian(runs)});
  }
  if (progress && me == 0) progress("send/recv: " + std::to_string(p2p_bytes.size()) + " message sizes");
  std::vector<std::pair<double, double>> exact, flt, mx;
  for (int64_t bytes : allreduce_bytes) {
    std::vector<int64_t> a(static_cast<size_t>(std::max<int64_t>(bytes / 8, 1)), 1);
    std::vector<float> f(static_cast<size_t>(std::max<int64_t>(bytes / 4, 1)), 1.0f);
    std::vector<double> ra, rf;
    // The exact sum as a step does it (the wire StepCore::startSum picks
    // for this size), the floats included.
    const int64_t n = static_cast<int64_t>(a.size());
    std::vector<float> mean(a.size());
    ShardScratch scratch;
    for (int r = 0; r < reps(bytes) + 1; ++r) {
      std::fill(a.begin(), a.end(), int64_t{1});
      double t0 = nowSeconds();
      if (useShardedSum(n, comm.size())) {
        startShardedSum(comm, a.data(), n, 0, scratch, [](int64_t, const int64_t* sums, int64_t len, float* out) {
          dequantize(sums, len, 40, 256.0, out);
        })->wait();
      } else {
        comm.allreduceSumAsync(a.data(), n)->wait();
        dequantize(a.data(), n, 40, 256.0, mean.data());
      }
      if (r > 0) ra.push_back(nowSeconds() - t0);
      t0 = nowSeconds();
      comm.allreduceSumAsync(f.data(), static_cast<int64_t>(f.size()))->wait();
      if (r > 0) rf.push_back(nowSeconds() - t0);
    }
    exact.push_back({static_cast<double>(a.size() * 8), robustMedian(ra)});
    flt.push_back({static_cast<double>(f.size() * 4), robustMedian(rf)});
  }
  for (int64_t bytes : {64, 512, 4096}) {
    std::vector<double> v(static_cast<size_t>(bytes / 8), 1.0), runs;
    for (int r = 0; r < 13; ++r) {
      const double t0 = nowSeconds();
      comm.allreduceMax(v.data(), static_cast<int64_t>(v.size()));
      if (r > 0) runs.push_back(nowSeconds() - t0);
    }
    mx.push_back({static_cast<double>(bytes), robustMedian(runs)});
  }
  if (progress && me == 0) progress("all-reduce: " + std::to_string(allreduce_bytes.size()) + " sizes, 2 ranks");
  if (!profile) return;
  profile->p2p = fitLine(p2p);
  profile->allreduce_exact[2] = fitLine(exact);
  profile->allreduce_float[2] = fitLine(flt);
  profile->allreduce_max[2] = fitLine(mx);
}

}  // namespace morph
