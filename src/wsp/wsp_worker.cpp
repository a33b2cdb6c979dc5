// WspWorker (wsp_worker.h).
#include "wsp/wsp_worker.h"

#include <time.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "core/sys.h"
#include "exec/fixed_point.h"
#include "wsp/own_pushes.h"
#include "wsp/packed_ints.h"
#include "wsp/wsp_recovery.h"

namespace morph {

namespace {
enum Kind : int64_t { kPush = 1, kPull = 2, kBye = 3, kSnapshot = 4 };
// A request's header: kind, clock (a snapshot's: its version), and for a
// pull the least version and the exact one (replay; -1 otherwise).
constexpr int64_t kHeader = 4;
// A snapshot's reply starts with: version, optimiser steps, state floats,
// optimiser floats; then the shard's scales.
constexpr int64_t kSnapshotHeader = 4;

// CPU seconds of the calling thread (a VW computes on its main thread:
// job.threads intra-op threads, 1 by default).
double threadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

WspWorker::WspWorker(const JobSpec& job, int64_t steps, VnExecutor& ex, Communicator& world,
                     const ReplayPlan* replay, CheckpointSink checkpoint)
    : job_(job), steps_(steps), ex_(ex), world_(world), replay_(replay), checkpoint_(std::move(checkpoint)),
      me_(world.rank()), vws_(world.size()) {
  StepCore& core = ex_.core();
  const int64_t start = core.nextStep();
  MORPH_CHECK(start % job_.wave == 0 || start == steps_,
              "a WSP run starts at step " + std::to_string(start) + ", not at a clock");
  clock_ = checkpointed_ = (start + job_.wave - 1) / job_.wave;
  base_.assign(static_cast<size_t>(vws_), clock_);
  orig_ = core.segments();
  pieces_ = ShardPieces::cut(core.buffer().segmentSizes(), vws_);
  map_ = pieces_.map;
  for (size_t p = 0; p < pieces_.segment.size(); ++p) {
    StepCore::Segment g = orig_[pieces_.segment[p]];
    if (g.state.defined() && pieces_.size[p] != g.state.numel()) {
      MORPH_CHECK(g.state.is_contiguous(), "a WSP shard splits a tensor that is not contiguous");
      g.state = g.state.view({-1}).narrow(0, pieces_.offset[p], pieces_.size[p]);
    }
    segs_.push_back(g);
    sizes_.push_back(pieces_.size[p]);
  }
  shard_ = std::make_unique<ParamShard>(job_, steps_, vws_, segs_, sizes_, map_.begin(me_), map_.end(me_),
                                        perPiece(core.buffer().scales().data()));
  if (clock_ > 0) {
    // A restored checkpoint: its optimiser state, in the shard's layout
    // (per piece of a parameter, each of its optimiser tensors' part).
    CheckpointData d = ex_.exportState();
    std::vector<std::vector<float>> per_seg(orig_.size());
    std::set<std::pair<size_t, int>> seen;  // a tied parameter is listed by each layer using it
    eachSegmentTensor(d, [&](size_t s, int i, torch::Tensor& t) {
      if (i < 0 || !seen.insert({s, i}).second) return;
      const torch::Tensor c = t.contiguous();
      per_seg[s].insert(per_seg[s].end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    });
    std::vector<float> optim;
    for (size_t p = map_.begin(me_); p < map_.end(me_); ++p) {
      const size_t s = pieces_.segment[p];
      if (per_seg[s].empty()) continue;
      const int64_t n = orig_[s].state.numel(), k = static_cast<int64_t>(per_seg[s].size()) / n;
      for (int64_t i = 0; i < k; ++i) {
        auto from = per_seg[s].begin() + i * n + pieces_.offset[p];
        optim.insert(optim.end(), from, from + pieces_.size[p]);
      }
    }
    shard_->restore(clock_, optim, d.meta.at("optim_steps").get<int64_t>());
  }
  if (job_.checkpoint_every > 0) {
    const int64_t wave = job_.wave, every = job_.checkpoint_every, total = steps_;
    shard_->keepSnapshots([=](int64_t v) { return wspCheckpointDue(v, wave, every, total); });
  }
  if (replay_) shard_->expectPulls(replay_->per_shard.at(static_cast<size_t>(me_)));
  wave_ = ScaledValues(sizes_);
  for (int p = 0; p < vws_; ++p)
    if (p != me_) servers_.emplace_back([this, p] { serve(p); });
}

template <typename T>
std::vector<T> WspWorker::perPiece(const T* per_segment) const {
  std::vector<T> out(pieces_.segment.size());
  for (size_t p = 0; p < out.size(); ++p) out[p] = per_segment[pieces_.segment[p]];
  return out;
}

WspWorker::~WspWorker() {
  for (auto& t : servers_)
    if (t.joinable()) t.detach();  // a server blocked on a lost peer: the process ends anyway
}

void WspWorker::serve(int peer) {
  try {
    torch::Tensor head = torch::empty({kHeader}, torch::kInt64);
    torch::Tensor payload = torch::empty({shard_->pushValues()}, torch::kInt64);
    while (true) {
      world_.recv(head, peer, kRequestTag)->wait();
      const int64_t* h = head.data_ptr<int64_t>();
      if (h[0] == kBye) return;
      if (h[0] == kPush) {
        // h[2]: the packed payload's bytes (packed_ints.h).
        MORPH_CHECK(h[2] > 0 && h[2] <= packedBytesAtMost(payload.numel()), "a push's packed size out of range");
        torch::Tensor packed = torch::empty({h[2]}, torch::kUInt8);
        world_.recv(packed, peer, kRequestTag)->wait();
        unpackInts(packed.data_ptr<uint8_t>(), h[2], payload.data_ptr<int64_t>(), payload.numel());
        shard_->push(peer, h[1], payload.data_ptr<int64_t>());
      } else {
        if (h[0] == kSnapshot) {
          const ParamShard::Snapshot snap = shard_->takeSnapshot(h[1], [this] { return stop(); });
          std::vector<int64_t> m{snap.version, snap.optim_steps, static_cast<int64_t>(snap.state.size()),
                                 static_cast<int64_t>(snap.optim.size())};
          m.insert(m.end(), snap.scales.begin(), snap.scales.end());
          world_.send(torch::tensor(m, torch::kInt64), peer, kReplyTag)->wait();
          for (const std::vector<float>* v : {&snap.state, &snap.optim}) {
            if (v->empty()) continue;
            torch::Tensor t = torch::from_blob(const_cast<float*>(v->data()), {static_cast<int64_t>(v->size())},
                                               torch::kFloat32);
            world_.send(t, peer, kReplyTag)->wait();
          }
          continue;
        }
        MORPH_CHECK_EQ(h[0], static_cast<int64_t>(kPull));
        const ParamShard::Pulled got = shard_->pull(h[2], h[3], [this] { return stop(); }, h[1]);
        torch::Tensor meta = torch::empty({1 + static_cast<int64_t>(got.scales.size())}, torch::kInt64);
        meta.data_ptr<int64_t>()[0] = got.version;
        for (size_t s = 0; s < got.scales.size(); ++s) meta.data_ptr<int64_t>()[1 + s] = got.scales[s];
        torch::Tensor state = torch::from_blob(const_cast<float*>(got.state.data()),
                                               {static_cast<int64_t>(got.state.size())}, torch::kFloat32)
                                  .clone();
        auto a = world_.send(meta, peer, kReplyTag);
        auto b = world_.send(state, peer, kReplyTag);
        a->wait();
        b->wait();
      }
    }
  } catch (...) {
    std::lock_guard<std::mutex> l(err_mu_);
    if (!server_error_) server_error_ = std::current_exception();
  }
}

void WspWorker::push(int64_t clock, int64_t minibatches) {
  MORPH_CHECK_EQ(wave_.terms, minibatches);
  const double t0 = nowSeconds();
  std::vector<std::unique_ptr<PendingWork>> sends;
  std::vector<torch::Tensor> keep;
  for (int r = 0; r < vws_; ++r) {
    std::vector<int64_t> payload;
    ParamShard::packPush(wave_, map_.begin(r), map_.end(r), base_[static_cast<size_t>(r)], payload);
    if (r == me_) {
      shard_->push(me_, clock, payload.data());
      continue;
    }
    std::vector<uint8_t> packed;
    packInts(payload.data(), static_cast<int64_t>(payload.size()), packed);
    const int64_t bytes = static_cast<int64_t>(packed.size());
    push_bytes_ += bytes;
    push_unpacked_bytes_ += 8 * static_cast<int64_t>(payload.size());
    torch::Tensor head = torch::tensor(std::vector<int64_t>{kPush, clock, bytes, 0}, torch::kInt64);
    torch::Tensor body = torch::empty({bytes}, torch::kUInt8);
    std::copy(packed.begin(), packed.end(), body.data_ptr<uint8_t>());
    sends.push_back(world_.send(head, r, kRequestTag));
    sends.push_back(world_.send(body, r, kRequestTag));
    keep.push_back(head);
    keep.push_back(body);
  }
  for (auto& s : sends) s->wait();
  seconds_.push += nowSeconds() - t0;
  ++pushes_;
  if (job_.staleness > 0 && job_.optim.name == "sgd") {
    // Kept until every shard's version passes the wave (pullAll).
    const double B = static_cast<double>(job_.global_batch * job_.targetsPerSample());
    std::vector<std::vector<float>>& g = own_[clock];
    g.resize(segs_.size());
    std::vector<int64_t>& st = own_stale_[clock];
    for (int64_t b : base_) st.push_back(clock - b);
    int64_t off = 0;
    for (size_t s = 0; s < segs_.size(); ++s) {
      if (segs_[s].kind == StepCore::Segment::kParam && segs_[s].state.defined()) {
        g[s].resize(static_cast<size_t>(sizes_[s]));
        dequantize(wave_.values.data() + off, sizes_[s], wave_.scales[s], B, g[s].data());
      }
      off += sizes_[s];
    }
  }
}

void WspWorker::addOwnPushes(int r, int64_t version, int64_t clock) {
  // Shard r's weights of `version` lack this VW's pushes of waves version ..
  // clock - 1: what the servers' SGD will do with them alone (ownPushesMove).
  for (size_t s = map_.begin(r); s < map_.end(r); ++s) {
    if (segs_[s].kind != StepCore::Segment::kParam || !segs_[s].state.defined()) continue;
    std::vector<const std::vector<float>*> grads;
    std::vector<int64_t> stale;
    for (int64_t i = version; i < clock; ++i) {
      auto it = own_.find(i);
      grads.push_back(it == own_.end() ? nullptr : &it->second[s]);
      stale.push_back(it == own_.end() ? 0 : own_stale_.at(i)[static_cast<size_t>(r)]);
    }
    const std::vector<float> move =
        ownPushesMove(job_, steps_, version, grads, stale, static_cast<size_t>(sizes_[s]));
    float* w = segs_[s].state.data_ptr<float>();
    for (size_t j = 0; j < move.size(); ++j) w[j] -= move[j];
  }
}

void WspWorker::pullAll(int64_t clock, bool final) {
  const int64_t pull = static_cast<int64_t>(records_.size());
  std::vector<int64_t> exact(static_cast<size_t>(vws_), -1);
  if (replay_) {
    const auto& mine = replay_->pulls.at(me_);
    if (pull >= static_cast<int64_t>(mine.size()))
      throw InputError("--replay: the log has " + std::to_string(mine.size()) + " pulls of virtual worker " +
                       std::to_string(me_) + ", this run makes more (another job or mapping?)");
    exact = mine[static_cast<size_t>(pull)];
  }
  const int64_t at_least = final ? clock : std::max<int64_t>(0, clock - job_.staleness);
  const double t0 = nowSeconds();
  // Every remote request first, so that the shards answer in parallel.
  std::vector<std::unique_ptr<PendingWork>> sends;
  std::vector<torch::Tensor> keep;
  for (int r = 0; r < vws_; ++r) {
    if (r == me_) continue;
    torch::Tensor head = torch::tensor(std::vector<int64_t>{kPull, clock, at_least, exact[static_cast<size_t>(r)]},
                                       torch::kInt64);
    sends.push_back(world_.send(head, r, kRequestTag));
    keep.push_back(head);
  }
  PullRecord rec;
  rec.vw = me_;
  rec.pull = pull;
  rec.clock = clock;
  rec.versions.assign(static_cast<size_t>(vws_), 0);
  StepCore& core = ex_.core();
  // Per segment, the coarsest scale of its pieces' shards (a tensor split
  // between shards at different versions may get two; with D = 0 they are
  // always equal).
  std::vector<int> scales(orig_.size(), std::numeric_limits<int>::max());
  torch::NoGradGuard no_grad;
  auto install = [&](int r, int64_t version, const int64_t* scl, const float* state, int64_t floats) {
    rec.versions[static_cast<size_t>(r)] = version;
    int64_t off = 0;
    for (size_t s = map_.begin(r); s < map_.end(r); ++s) {
      int& to = scales[pieces_.segment[s]];
      to = std::min(to, static_cast<int>(scl[s - map_.begin(r)]));
      const torch::Tensor& t = segs_[s].state;
      if (!t.defined()) continue;
      MORPH_CHECK(off + t.numel() <= floats, "a pulled shard is shorter than its tensors");
      std::copy(state + off, state + off + t.numel(), t.data_ptr<float>());
      off += t.numel();
    }
    MORPH_CHECK_EQ(off, floats);
  };
  {
    const ParamShard::Pulled got = shard_->pull(at_least, exact[static_cast<size_t>(me_)], [this] { return stop(); }, clock);
    std::vector<int64_t> scl(got.scales.begin(), got.scales.end());
    install(me_, got.version, scl.data(), got.state.data(), static_cast<int64_t>(got.state.size()));
  }
  const double t1 = nowSeconds();
  seconds_.gate += t1 - t0;
  for (int r = 0; r < vws_; ++r) {
    if (r == me_) continue;
    int64_t nseg = static_cast<int64_t>(map_.end(r) - map_.begin(r)), floats = 0;
    for (size_t s = map_.begin(r); s < map_.end(r); ++s)
      if (segs_[s].state.defined()) floats += segs_[s].state.numel();
    torch::Tensor meta = torch::empty({1 + nseg}, torch::kInt64);
    torch::Tensor state = torch::empty({floats}, torch::kFloat32);
    auto a = world_.recv(meta, r, kReplyTag);
    auto b = world_.recv(state, r, kReplyTag);
    a->wait();
    b->wait();
    install(r, meta.data_ptr<int64_t>()[0], meta.data_ptr<int64_t>() + 1, state.data_ptr<float>(), floats);
  }
  for (auto& s : sends) s->wait();
  seconds_.pull += nowSeconds() - t1;
  if (!own_.empty()) {
    for (int r = 0; r < vws_; ++r) addOwnPushes(r, rec.versions[static_cast<size_t>(r)], clock);
    const int64_t applied = *std::min_element(rec.versions.begin(), rec.versions.end());
    own_.erase(own_.begin(), own_.lower_bound(applied));
    own_stale_.erase(own_stale_.begin(), own_stale_.lower_bound(applied));
  }
  base_ = rec.versions;
  core.buffer().setScales(scales);
  MORPH_CHECK(rec.gap() <= job_.staleness || final, "a pull past the staleness bound");
  records_.push_back(rec);
}

void WspWorker::bye() {
  for (int r = 0; r < vws_; ++r) {
    if (r == me_) continue;
    torch::Tensor head = torch::tensor(std::vector<int64_t>{kBye, 0, 0, 0}, torch::kInt64);
    world_.send(head, r, kRequestTag)->wait();
  }
}

void WspWorker::run(const std::function<void(const StepStats&)>& minibatch) {
  StepCore& core = ex_.core();
  GradAccumulator& buf = core.buffer();
  const int64_t waves = (steps_ + job_.wave - 1) / job_.wave;
  StepStats last;
  for (int64_t c = clock_; c < waves; ++c) {
    wave_.clear();
    const int64_t first = c * job_.wave, end = std::min(steps_, first + job_.wave);
    for (int64_t t = first; t < end; ++t) {
      MORPH_CHECK_EQ(core.nextStep(), t);
      const double w0 = nowSeconds(), c0 = threadCpuSeconds();
      last = ex_.localStep();
      seconds_.compute += nowSeconds() - w0;
      seconds_.compute_cpu += threadCpuSeconds() - c0;
      std::vector<double> fm = buf.flagsAndMax();
      // Every piece of a tensor at its scale, with its maximum: the shards
      // of a split tensor choose the same next scale.
      wave_.add(buf.exactBuffer(), perPiece(buf.usedScales().data()).data(), perPiece(fm.data() + 2).data());
      // The pulled scales stay until a local redo replaces them (docs/wsp.md).
      if (last.attempts == 1) buf.setScales(buf.usedScales());
      if (t + 1 < steps_) {
        const double m0 = nowSeconds();
        minibatch(last);
        seconds_.minibatch += nowSeconds() - m0;
      }
    }
    push(c, end - first);
    clock_ = c + 1;
    {
      std::lock_guard<std::mutex> l(err_mu_);
      if (server_error_) std::rethrow_exception(server_error_);
    }
    pullAll(c + 1, c + 1 == waves);
    if (checkpoint_) {
      const double k0 = nowSeconds();
      // Every version the pull found on every shard: each shard kept its
      // snapshot of those due (docs/wsp.md), so the gathering waits for none.
      const std::vector<int64_t>& v = records_.back().versions;
      const int64_t reached = *std::min_element(v.begin(), v.end());
      for (int64_t k = checkpointed_ + 1; k <= reached; ++k)
        if (wspCheckpointDue(k, job_.wave, job_.checkpoint_every, steps_)) gatherCheckpoint(k);
      checkpointed_ = std::max(checkpointed_, reached);
      seconds_.checkpoint += nowSeconds() - k0;
    }
  }
  bye();
  for (auto& t : servers_) t.join();
  if (server_error_) std::rethrow_exception(server_error_);
  minibatch(last);
}

void WspWorker::eachSegmentTensor(CheckpointData& d, const std::function<void(size_t, int, torch::Tensor&)>& f) const {
  std::map<const void*, size_t> seg_of;
  for (size_t s = 0; s < orig_.size(); ++s)
    if (orig_[s].state.defined()) seg_of[orig_[s].state.unsafeGetTensorImpl()] = s;
  std::set<size_t> found;
  for (auto& [lname, tensors] : d.layers) {
    int64_t param = -1;  // the segment of the parameter whose optimiser state follows
    int k = 0;
    for (auto& [name, t] : tensors) {
      if (name.rfind("optim/", 0) == 0) {
        if (param >= 0) f(static_cast<size_t>(param), k++, t);
        continue;
      }
      param = -1;
      auto it = seg_of.find(t.unsafeGetTensorImpl());
      if (it == seg_of.end()) continue;
      found.insert(it->second);
      f(it->second, -1, t);
      if (orig_[it->second].kind == StepCore::Segment::kParam) param = static_cast<int64_t>(it->second), k = 0;
    }
  }
  MORPH_CHECK_EQ(found.size(), seg_of.size());
}

void WspWorker::gatherCheckpoint(int64_t k) {
  std::vector<std::unique_ptr<PendingWork>> sends;
  std::vector<torch::Tensor> keep;
  for (int r = 0; r < vws_; ++r) {
    if (r == me_) continue;
    torch::Tensor head = torch::tensor(std::vector<int64_t>{kSnapshot, k, 0, 0}, torch::kInt64);
    sends.push_back(world_.send(head, r, kRequestTag));
    keep.push_back(head);
  }
  std::vector<ParamShard::Snapshot> snaps(static_cast<size_t>(vws_));
  snaps[static_cast<size_t>(me_)] = shard_->takeSnapshot(k, [this] { return stop(); });
  for (int r = 0; r < vws_; ++r) {
    if (r == me_) continue;
    ParamShard::Snapshot& s = snaps[static_cast<size_t>(r)];
    const int64_t nseg = static_cast<int64_t>(map_.end(r) - map_.begin(r));
    torch::Tensor meta = torch::empty({kSnapshotHeader + nseg}, torch::kInt64);
    world_.recv(meta, r, kReplyTag)->wait();
    const int64_t* m = meta.data_ptr<int64_t>();
    s.version = m[0];
    s.optim_steps = m[1];
    s.scales.assign(m + kSnapshotHeader, m + kSnapshotHeader + nseg);
    for (auto [v, n] : {std::pair{&s.state, m[2]}, std::pair{&s.optim, m[3]}}) {
      v->assign(static_cast<size_t>(n), 0.0f);
      if (n == 0) continue;
      torch::Tensor t = torch::from_blob(v->data(), {n}, torch::kFloat32);
      world_.recv(t, r, kReplyTag)->wait();
    }
  }
  for (auto& s : sends) s->wait();
  // The executor's own state gives the layout (layers, names, shapes); every
  // segment's tensors are replaced by its pieces' snapshots, put together.
  CheckpointData d = ex_.exportState();
  std::vector<int> scales = ex_.core().buffer().scales();
  // Optimiser state floats per segment: each of its tensors has the
  // parameter's shape.
  std::vector<int64_t> optim_floats(orig_.size(), 0);
  std::set<std::pair<size_t, int>> seen;  // a tied parameter is listed by each layer using it
  eachSegmentTensor(d, [&](size_t seg, int i, torch::Tensor& t) {
    if (i >= 0 && seen.insert({seg, i}).second) optim_floats[seg] += t.numel();
  });
  std::vector<std::vector<float>> state(orig_.size()), optim(orig_.size());
  for (size_t seg = 0; seg < orig_.size(); ++seg) {
    if (orig_[seg].state.defined()) state[seg].resize(static_cast<size_t>(orig_[seg].state.numel()));
    optim[seg].resize(static_cast<size_t>(optim_floats[seg]));
  }
  for (int r = 0; r < vws_; ++r) {
    const ParamShard::Snapshot& s = snaps[static_cast<size_t>(r)];
    MORPH_CHECK_EQ(s.version, k);
    MORPH_CHECK_EQ(s.optim_steps, snaps[0].optim_steps);
    // ParamShard::Snapshot's layout: the pieces' state in turn; then per
    // parameter piece, each of its optimiser tensors.
    int64_t state_off = 0, optim_off = 0;
    for (size_t p = map_.begin(r); p < map_.end(r); ++p) {
      const size_t seg = pieces_.segment[p];
      const int64_t at = pieces_.offset[p], len = pieces_.size[p];
      scales[seg] = s.scales.at(p - map_.begin(r));  // every piece's is the same (the same maxima)
      if (!orig_[seg].state.defined()) continue;
      std::copy(s.state.begin() + state_off, s.state.begin() + state_off + len, state[seg].begin() + at);
      state_off += len;
      const int64_t n = orig_[seg].state.numel();
      for (int64_t i = 0; i < optim_floats[seg] / n; ++i) {
        std::copy(s.optim.begin() + optim_off, s.optim.begin() + optim_off + len, optim[seg].begin() + i * n + at);
        optim_off += len;
      }
    }
    MORPH_CHECK_EQ(state_off, static_cast<int64_t>(s.state.size()));
    MORPH_CHECK_EQ(optim_off, static_cast<int64_t>(s.optim.size()));
  }
  eachSegmentTensor(d, [&](size_t seg, int i, torch::Tensor& t) {
    float* src = i < 0 ? state[seg].data() : optim[seg].data() + i * t.numel();
    t = torch::from_blob(src, t.sizes(), torch::kFloat32);
  });
  d.step = std::min(k * job_.wave, steps_);
  d.meta["step"] = d.step;
  d.meta["optim_steps"] = snaps[0].optim_steps;
  d.meta["wsp"] = {{"clock", k}, {"virtual_workers", vws_}};
  for (auto& [name, t] : d.extra)
    if (name == "exact/scales") t = torch::tensor(std::vector<int32_t>(scales.begin(), scales.end()), torch::kInt32);
  checkpoint_(d);
}

int64_t WspWorker::maxGap() const {
  int64_t g = 0;
  for (const PullRecord& r : records_) g = std::max(g, r.gap());
  return g;
}

nlohmann::json WspWorker::Seconds::toJson(int vw) const {
  return {{"vw", vw},           {"compute", compute}, {"compute_cpu", compute_cpu}, {"minibatch", minibatch},
          {"push", push},       {"gate", gate},       {"pull", pull},               {"checkpoint", checkpoint}};
}

nlohmann::json WspWorker::result() const {
  nlohmann::json recs = nlohmann::json::array();
  for (const PullRecord& r : records_) recs.push_back(r.toJson());
  return {{"vw", me_},           {"pushes", pushes_},           {"pulls", records_.size()},
          {"max_clock_gap", maxGap()}, {"seconds", seconds_.toJson(me_)}, {"shard_values", shard_->values()},
          {"push_bytes", push_bytes_}, {"push_unpacked_bytes", push_unpacked_bytes_}, {"records", recs}};
}

}  // namespace morph
