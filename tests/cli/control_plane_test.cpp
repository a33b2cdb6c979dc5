// The authenticated control plane end to end: a real `morph run --workers 2`
// is attacked through its store while it trains (no token, wrong token,
// replayed handshake, forged manager keys, garbage, truncated and oversized
// frames, 1000 connections opened and dropped) and must still end with the
// single-process run's model_hash; it listens on loopback only.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "cli_util.h"
#include "cli/command_line.h"
#include "store/client.h"
#include "store/protocol.h"

namespace {

using namespace morph_test;
using namespace morph::store;

const char* kJob = R"([job]
name = "control-plane"
seed = 11
steps = 1500
[data]
dataset = "synthetic"
train_size = 512
test_size = 32
[model]
name = "mlp"
hidden = [16]
[batch]
global = 32
virtual_nodes = 4
[optim]
lr = 0.05
momentum = 0.9
[eval]
every = 0
[elastic]
straggler_replan = false
)";

// `morph ARGS` in the background, stdout and stderr to `log`.
pid_t startMorph(const std::string& args, const std::string& log) {
  const std::string cmd = "exec " + std::string(MORPH_BINARY) + " " + args + " > " + log + " 2>&1";
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The port the manager printed, waiting up to 20 s.
int managerPort(const std::string& log) {
  for (int i = 0; i < 400; ++i) {
    const std::string s = slurp(log);
    const auto p = s.find("manager on port ");
    if (p != std::string::npos) return std::atoi(s.c_str() + p + 16);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "the manager did not start:\n" << slurp(log);
  return 0;
}

int dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// Socket inodes of `pid` and its children.
std::set<std::string> socketInodes(pid_t pid) {
  std::set<pid_t> pids = {pid};
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream st(e.path() / "stat");
    std::string comm_etc;
    if (!std::getline(st, comm_etc)) continue;
    const auto rp = comm_etc.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(comm_etc.substr(rp + 2));
    char state;
    pid_t ppid;
    if (rest >> state >> ppid && ppid == pid) pids.insert(std::atoi(e.path().filename().c_str()));
  }
  std::set<std::string> inodes;
  for (pid_t p : pids) {
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(p) + "/fd", ec)) {
      const std::string l = fs::read_symlink(fd.path(), ec).string();
      if (l.rfind("socket:[", 0) == 0) inodes.insert(l.substr(8, l.size() - 9));
    }
  }
  return inodes;
}

// Listening sockets of the job (manager and workers) not on loopback, as
// "file: local_address" lines of /proc/net/tcp{,6}.
std::vector<std::string> nonLoopbackListeners(pid_t manager) {
  const auto mine = socketInodes(manager);
  std::vector<std::string> bad;
  int listening = 0;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ss(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (st != "0A" || !mine.count(inode)) continue;  // 0A: LISTEN
      ++listening;
      const std::string addr = local.substr(0, local.find(':'));
      const bool loopback4 = addr.size() == 8 && addr.substr(6, 2) == "7F";  // 127.x.x.x, little-endian hex
      const bool loopback6 = addr == "00000000000000000000000001000000";
      if (!loopback4 && !loopback6) bad.push_back(std::string(file) + ": " + local);
    }
  }
  EXPECT_GE(listening, 1) << "expected at least the store among the job's listening sockets";
  return bad;
}

TEST_F(Cli, StoreRefusesAttackersWhileTheJobTrains) {
  unsetenv("MORPH_TOKEN");
  const std::string j = job(kJob);
  Result ref = run("run " + j + " --quiet --out " + out("ref"));
  ASSERT_EQ(ref.code, 0) << ref.out;

  // No token at all: exit 2 saying so, before any connection.
  Result missing = run("status --join 127.0.0.1:1");
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("missing job token"), std::string::npos) << missing.out;

  const std::string log = out("job.log"), dir = out("job");
  pid_t pid = startMorph("run " + j + " --quiet --workers 2 --out " + dir, log);
  const int port = managerPort(log);
  ASSERT_GT(port, 0);
  const std::string token_file = dir + "/token";
  struct stat st {};
  ASSERT_EQ(stat(token_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string token;
  std::getline(std::ifstream(token_file), token);
  EXPECT_EQ(token.size(), 64u);
  const std::string join = "127.0.0.1:" + std::to_string(port);
  auto connect = [&](const std::string& key, const std::string& role) {
    return c10::make_intrusive<morph::StoreClient>("127.0.0.1", port, key, role, std::chrono::seconds(5));
  };
  // Wait until training is under way (Gloo's groups formed).
  for (int i = 0; i < 400 && !fs::exists(dir + "/metrics.jsonl"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  // The job outlasts the attacks however busy the machine is: worker 1 runs
  // 30 times slower until they are over (what `morph slow` writes; the
  // job's straggler re-plans are off, so it stays a member).
  auto slow = connect(token, "client");
  slow->set("ctl/slow/1", {'3', '0'});

  // Loopback only: the store, and any listener of a worker (Gloo).
  EXPECT_EQ(nonLoopbackListeners(pid), std::vector<std::string>{});

  // A wrong token (exit 2 saying so), the right one.
  std::ofstream(out("wrong")) << std::string(64, 'a') << "\n";
  Result r = run("worker --join " + join + " --token-file " + out("wrong"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("rejected job token"), std::string::npos) << r.out;
  r = run("status --join " + join + " --token-file " + token_file);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"generation\""), std::string::npos) << r.out;
  // `morph resize` (the client role) reaches the manager: to the same size.
  r = run("resize --join " + join + " --workers 2 --token-file " + token_file);
  EXPECT_EQ(r.code, 0) << r.out;
  // More workers than VNs: refused where the user sees it, exit 2.
  r = run("resize --join " + join + " --workers 4000 --token-file " + token_file);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("batch.virtual_nodes"), std::string::npos) << r.out;
  EXPECT_THROW(connect("not-the-token", "client"), morph::StoreAuthError);
  EXPECT_THROW(connect(token, "manager"), morph::StoreAuthError);

  // Reading job/text without the handshake: the connection is closed, no value.
  {
    int fd = dial(port);
    Request q;
    q.op = Op::kGet;
    q.keys = {"job/text"};
    writeFrame(fd, encodeRequest(q));
    std::vector<uint8_t> buf, seen;
    try {
      while (readFrame(fd, kMaxFrame, buf, 5000)) seen.insert(seen.end(), buf.begin(), buf.end());
    } catch (const std::exception&) {
    }
    EXPECT_EQ(std::string(seen.begin(), seen.end()).find("[job]"), std::string::npos);
    close(fd);
  }
  // A captured handshake replayed on a new connection.
  {
    int a = dial(port), b = dial(port);
    std::vector<uint8_t> buf;
    ASSERT_TRUE(readFrame(a, kMaxHandshakeFrame, buf, 5000));
    Auth auth;
    auth.role = "client";
    auth.mac = clientProof(token, decodeHello(buf.data(), buf.size()).nonce, "client");
    ASSERT_TRUE(readFrame(b, kMaxHandshakeFrame, buf, 5000));
    writeFrame(b, encodeAuth(auth));
    ASSERT_TRUE(readFrame(b, kMaxHandshakeFrame, buf, 5000));
    EXPECT_EQ(decodeVerdict(buf.data(), buf.size()).status, Status::kRejected);
    close(a);
    close(b);
  }
  // The token but not the manager's role: forged membership, outputs, results.
  // It cannot pass for worker 0, and registered as a worker of its own it
  // may write only that worker's keys.
  EXPECT_THROW(connect(token, "worker/0"), morph::StoreAuthError);
  auto intruder = connect(token, "worker");
  EXPECT_EQ(intruder->add("workers/next_id", 1), 3);  // worker 2
  auto cl = connect(token, "client");
  for (const char* k : {"gen/current", "gen/want", "gen/0/plan", "job/out", "job/resume", "job/ckpt_dir", "result/0",
                        "result/1", "job/finished", "workers/1/hb", "gen/0/ready/0", "job/steps"}) {
    EXPECT_THROW(intruder->set(k, {'9'}), morph::StoreError) << k;
    EXPECT_THROW(cl->set(k, {'9'}), morph::StoreError) << k;
  }
  EXPECT_THROW(intruder->set("ctl/resize_target", {'x'}), morph::StoreError);
  EXPECT_FALSE(intruder->get("job/text").empty());  // reads stay open

  // Garbage, truncated and oversized frames, before and after authenticating.
  const std::vector<std::vector<uint8_t>> bad = {
      {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1', '.', '1', '\r', '\n', '\r', '\n'},
      {0xff, 0xff, 0xff, 0xff, 1, 2, 3},
      {200, 0, 0, 0, 1, 5, 0},
      {5, 0, 0, 0, 42, 0, 0, 0, 0}};
  for (bool authenticate : {false, true})
    for (const auto& raw : bad) {
      int fd = dial(port);
      std::vector<uint8_t> buf;
      ASSERT_TRUE(readFrame(fd, kMaxHandshakeFrame, buf, 5000));
      if (authenticate) {
        Auth a;
        a.role = "client";
        a.nonce = randomNonce();
        a.mac = clientProof(token, decodeHello(buf.data(), buf.size()).nonce, "client");
        writeFrame(fd, encodeAuth(a));
        ASSERT_TRUE(readFrame(fd, kMaxHandshakeFrame, buf, 5000));
      }
      send(fd, raw.data(), raw.size(), MSG_NOSIGNAL);
      shutdown(fd, SHUT_WR);
      close(fd);
    }
  // 1000 connections opened and dropped.
  for (int i = 0; i < 1000; ++i) close(dial(port));

  const bool still_training = !fs::exists(dir + "/summary.json");
  slow->set("ctl/slow/1", {'1'});
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string got = slurp(log);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << got;
  EXPECT_TRUE(still_training) << "the job ended before the attacks did; make it longer";
  EXPECT_EQ(lastLineHash(got), lastLineHash(ref.out)) << got;
  EXPECT_NE(got.find("refused a write of 'gen/current'"), std::string::npos) << got;
  EXPECT_NE(got.find("morph: store: refused"), std::string::npos) << got;
  EXPECT_NE(got.find("resize requested: 2 -> 2 workers"), std::string::npos) << got;
}

// Pids of the processes whose parent is `parent`, from /proc.
std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string stat = slurp((e.path() / "stat").string());
    const auto rp = stat.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(stat.substr(rp + 2));
    char state;
    pid_t ppid;
    if (rest >> state >> ppid && ppid == parent && state != 'Z') out.push_back(std::atoi(e.path().filename().c_str()));
  }
  return out;
}

// A process's arguments as /proc shows them, trailing empty ones dropped.
std::vector<std::string> argsOf(pid_t pid) {
  const std::string raw = slurp("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> args;
  size_t at = 0;
  while (at < raw.size()) {
    const size_t end = raw.find('\0', at);
    args.push_back(raw.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  while (!args.empty() && args.back().empty()) args.pop_back();
  return args;
}

// The signals a process ignores (SigIgn in /proc: bit N-1 is signal N).
uint64_t ignoredSignals(pid_t pid) {
  std::istringstream status(slurp("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(status, line);)
    if (line.rfind("SigIgn:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  return 0;
}

// Local workers are forked from the worker zygote (control/manager/zygote.h)
// yet look and behave as exec'd ones: children of the manager, `morph
// worker --join HOST:PORT --token-file FILE` in /proc, SIGPIPE ignored, gone when the manager
// is killed (the zygote too), and the same model_hash as exec'd workers.
TEST_F(Cli, LocalWorkersAreForkedChildrenOfTheManager) {
  const std::string j = job(kJob);
  Result forked = run("run " + j + " --quiet --steps 40 --workers 2 --out " + out("forked"));
  ASSERT_EQ(forked.code, 0) << forked.out;
  EXPECT_NE(forked.out.find("started 2 local workers (2 forked from the worker zygote)"), std::string::npos)
      << forked.out;
  setenv("MORPH_ZYGOTE", "0", 1);
  Result execd = run("run " + j + " --quiet --steps 40 --workers 2 --out " + out("execd"));
  unsetenv("MORPH_ZYGOTE");
  ASSERT_EQ(execd.code, 0) << execd.out;
  EXPECT_NE(execd.out.find("started 2 local workers (0 forked from the worker zygote)"), std::string::npos)
      << execd.out;
  EXPECT_EQ(lastLineHash(execd.out), lastLineHash(forked.out));

  const std::string log = out("job.log"), dir = out("job");
  const pid_t manager = startMorph("run " + j + " --quiet --workers 2 --out " + dir, log);
  const int port = managerPort(log);
  ASSERT_GT(port, 0);
  std::vector<pid_t> workers;
  pid_t zygote = -1;
  for (int i = 0; i < 400 && workers.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    workers.clear();
    for (pid_t c : childrenOf(manager)) {
      const auto args = argsOf(c);
      if (args.size() > 1 && args[1] == "worker") workers.push_back(c);
      if (args == argsOf(manager)) zygote = c;
    }
  }
  ASSERT_EQ(workers.size(), 2u) << slurp(log);
  EXPECT_GT(zygote, 0) << "no child of the manager has its command line (the zygote)";
  for (pid_t w : workers) {
    const auto args = argsOf(w);
    ASSERT_EQ(args.size(), 6u);
    EXPECT_TRUE(fs::equivalent(args[0], MORPH_BINARY)) << args[0];
    EXPECT_EQ(args[2], "--join");
    EXPECT_EQ(args[3], "127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(args[4], "--token-file");
    EXPECT_EQ(args[5], dir + "/token");
    // SIGPIPE ignored (this test's own disposition is the default): a
    // worker writing to a peer that just died gets EPIPE and joins the
    // next generation instead of being killed.
    EXPECT_TRUE(ignoredSignals(w) & (uint64_t{1} << (SIGPIPE - 1))) << "worker " << w << " does not ignore SIGPIPE";
  }
  EXPECT_EQ(workersOfPort(std::to_string(port)), 2);  // what the shell tests' pgrep sees
  // The front gave the engine's malloc transparent huge pages
  // (cli/command_line.h, hugePageTunables); its workers inherit them.
  const std::string tunables = "GLIBC_TUNABLES=" + morph::hugePageTunables(std::getenv("GLIBC_TUNABLES"));
  EXPECT_NE(tunables.find("glibc.malloc.hugetlb="), std::string::npos);
  for (pid_t p : {manager, workers[0], workers[1]}) {
    const std::string env = '\0' + slurp("/proc/" + std::to_string(p) + "/environ");
    EXPECT_NE(env.find('\0' + tunables + '\0'), std::string::npos) << "process " << p << " runs without " << tunables;
  }
  ::kill(manager, SIGKILL);
  waitpid(manager, nullptr, 0);
  const auto ended = [](pid_t p) {
    return ::kill(p, 0) != 0 || slurp("/proc/" + std::to_string(p) + "/stat").find(") Z") != std::string::npos;
  };
  bool gone = false;
  for (int i = 0; i < 160 && !gone; ++i) {  // 8 s: the kernel signals them at once (a lost heartbeat takes 10 s)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = ended(zygote) && std::all_of(workers.begin(), workers.end(), ended);
  }
  EXPECT_TRUE(gone) << "workers or the zygote outlived their manager";
}

// A finished job leaves no process behind: its workers and the worker
// zygote are reaped by the manager before `morph run` exits (run in a
// session of its own: whatever is left in its process group afterwards is
// listed; an orphan would be reparented, and here nothing reaps it).
TEST_F(Cli, NothingOutlivesAFinishedJob) {
  const std::string j = job(kJob);
  const std::string cmd = "setsid sh -c '" + std::string(MORPH_BINARY) + " run " + j + " --quiet --steps 3 --workers 2 --out " +
                          out("done") + " > " + out("done.log") + " 2>&1; echo rc=$?; ps -o pid=,stat=,comm= -g $$'";
  FILE* p = popen(cmd.c_str(), "r");
  std::string listing;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) listing.append(buf, n);
  pclose(p);
  EXPECT_NE(listing.find("rc=0"), std::string::npos) << listing << slurp(out("done.log"));
  EXPECT_EQ(listing.find("morph"), std::string::npos) << "left in the job's process group:\n" << listing;
}

// --host 0.0.0.0 listens everywhere, with a warning; an address this
// machine does not have is refused (exit 2) instead of silently widened.
TEST_F(Cli, StoreListensOnTheHostAddressOnly) {
  const std::string j = job(kJob);
  Result ref = run("run " + j + " --quiet --steps 3 --out " + out("ref"));
  ASSERT_EQ(ref.code, 0) << ref.out;
  Result any = run("run " + j + " --quiet --steps 3 --workers 1 --host 0.0.0.0 --out " + out("any"));
  ASSERT_EQ(any.code, 0) << any.out;
  EXPECT_NE(any.out.find("warning: --host 0.0.0.0"), std::string::npos) << any.out;
  EXPECT_EQ(lastLineHash(any.out), lastLineHash(ref.out));
  Result foreign = run("run " + j + " --quiet --steps 3 --workers 1 --host 192.0.2.1 --out " + out("x"));
  EXPECT_EQ(foreign.code, 2) << foreign.out;
  EXPECT_NE(foreign.out.find("cannot host the job's store"), std::string::npos) << foreign.out;
}

}  // namespace
