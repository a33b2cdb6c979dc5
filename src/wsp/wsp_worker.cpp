// WspWorker (wsp_worker.h).
#include "wsp/wsp_worker.h"

#include <algorithm>

#include "core/error.h"

namespace morph {

namespace {
enum Kind : int64_t { kPush = 1, kPull = 2, kBye = 3 };
// A request's header: kind, clock, and for a pull the least version and the
// exact one (replay; -1 otherwise).
constexpr int64_t kHeader = 4;
}  // namespace

WspWorker::WspWorker(const JobSpec& job, int64_t steps, VnExecutor& ex, Communicator& world,
                     const ReplayPlan* replay)
    : job_(job), steps_(steps), ex_(ex), world_(world), replay_(replay), me_(world.rank()), vws_(world.size()) {
  StepCore& core = ex_.core();
  MORPH_CHECK_EQ(core.nextStep(), 0);
  segs_ = core.segments();
  sizes_ = core.buffer().segmentSizes();
  map_ = ShardMap::balance(sizes_, vws_);
  shard_ = std::make_unique<ParamShard>(job_, steps_, vws_, segs_, sizes_, map_.begin(me_), map_.end(me_),
                                        core.buffer().scales());
  if (replay_) shard_->expectPulls(replay_->per_shard.at(static_cast<size_t>(me_)));
  wave_ = ScaledValues(sizes_);
  for (int p = 0; p < vws_; ++p)
    if (p != me_) servers_.emplace_back([this, p] { serve(p); });
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
        world_.recv(payload, peer, kRequestTag)->wait();
        shard_->push(peer, h[1], payload.data_ptr<int64_t>());
      } else {
        MORPH_CHECK_EQ(h[0], static_cast<int64_t>(kPull));
        const ParamShard::Pulled got = shard_->pull(h[2], h[3]);
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
  std::vector<std::unique_ptr<PendingWork>> sends;
  std::vector<torch::Tensor> keep;
  for (int r = 0; r < vws_; ++r) {
    std::vector<int64_t> payload;
    ParamShard::packPush(wave_, map_.begin(r), map_.end(r), payload);
    if (r == me_) {
      shard_->push(me_, clock, payload.data());
      continue;
    }
    torch::Tensor head = torch::tensor(std::vector<int64_t>{kPush, clock, 0, 0}, torch::kInt64);
    torch::Tensor body = torch::tensor(payload, torch::kInt64);
    sends.push_back(world_.send(head, r, kRequestTag));
    sends.push_back(world_.send(body, r, kRequestTag));
    keep.push_back(head);
    keep.push_back(body);
  }
  for (auto& s : sends) s->wait();
  ++pushes_;
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
  std::vector<int> scales = core.buffer().scales();
  torch::NoGradGuard no_grad;
  auto install = [&](int r, int64_t version, const int64_t* scl, const float* state, int64_t floats) {
    rec.versions[static_cast<size_t>(r)] = version;
    int64_t off = 0;
    for (size_t s = map_.begin(r); s < map_.end(r); ++s) {
      scales[s] = static_cast<int>(scl[s - map_.begin(r)]);
      const torch::Tensor& t = segs_[s].state;
      if (!t.defined()) continue;
      MORPH_CHECK(off + t.numel() <= floats, "a pulled shard is shorter than its tensors");
      std::copy(state + off, state + off + t.numel(), t.data_ptr<float>());
      off += t.numel();
    }
    MORPH_CHECK_EQ(off, floats);
  };
  {
    const ParamShard::Pulled got = shard_->pull(at_least, exact[static_cast<size_t>(me_)]);
    std::vector<int64_t> scl(got.scales.begin(), got.scales.end());
    install(me_, got.version, scl.data(), got.state.data(), static_cast<int64_t>(got.state.size()));
  }
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
  for (int64_t c = 0; c < waves; ++c) {
    wave_.clear();
    const int64_t first = c * job_.wave, end = std::min(steps_, first + job_.wave);
    for (int64_t t = first; t < end; ++t) {
      MORPH_CHECK_EQ(core.nextStep(), t);
      last = ex_.localStep();
      std::vector<double> fm = buf.flagsAndMax();
      wave_.add(buf.exactBuffer(), buf.usedScales().data(), fm.data() + 2);
      // The pulled scales stay until a local redo replaces them (docs/wsp.md).
      if (last.attempts == 1) buf.setScales(buf.usedScales());
      if (t + 1 < steps_) minibatch(last);
    }
    push(c, end - first);
    {
      std::lock_guard<std::mutex> l(err_mu_);
      if (server_error_) std::rethrow_exception(server_error_);
    }
    pullAll(c + 1, c + 1 == waves);
  }
  bye();
  for (auto& t : servers_) t.join();
  if (server_error_) std::rethrow_exception(server_error_);
  minibatch(last);
}

int64_t WspWorker::maxGap() const {
  int64_t g = 0;
  for (const PullRecord& r : records_) g = std::max(g, r.gap());
  return g;
}

nlohmann::json WspWorker::result() const {
  nlohmann::json recs = nlohmann::json::array();
  for (const PullRecord& r : records_) recs.push_back(r.toJson());
  return {{"pushes", pushes_}, {"pulls", records_.size()}, {"max_clock_gap", maxGap()}, {"records", recs}};
}

}  // namespace morph
