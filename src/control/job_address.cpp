// The job's address, token and text values (job_address.h).
#include "control/job_address.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/token_file.h"

namespace morph {
namespace detail {

int64_t parseStoreInt(const std::string& key, const std::string& value) {
  const size_t digits = value.size() - (value.rfind('-', 0) == 0 ? 1 : 0);
  bool ok = digits > 0 && digits <= 19 &&
            std::all_of(value.end() - static_cast<std::ptrdiff_t>(digits), value.end(),
                        [](char c) { return c >= '0' && c <= '9'; });
  int64_t v = 0;
  if (ok) {
    errno = 0;
    char* end = nullptr;
    v = std::strtoll(value.c_str(), &end, 10);
    ok = errno == 0 && *end == '\0';
  }
  if (!ok)
    throw JobError("the job's store holds '" + value.substr(0, 40) + "' under " + key +
                   ", where a whole number belongs: a worker or client wrote a bad value (docs/distributed.md, store keys)");
  return v;
}
std::string joinLines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}
std::vector<std::string> splitLines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

std::pair<std::string, int> parseHostPort(const std::string& s, const std::string& flag) {
  const auto colon = s.rfind(':');
  const std::string digits = colon == std::string::npos ? "" : s.substr(colon + 1);
  const bool number = !digits.empty() && digits.size() <= 5 &&
                      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int port = number ? std::stoi(digits) : 0;
  if (colon == std::string::npos || colon == 0 || port < 1 || port > 65535)
    throw InputError(flag + " '" + s + "': expected HOST:PORT of a running manager (PORT 1..65535)");
  return {s.substr(0, colon), port};
}

std::string readToken(const std::string& token_file) {
  return readTokenFrom(token_file, {"missing job token", "missing job token: ",
                                    "the job's token is OUT/token of `morph run`",
                                    "pass --token-file FILE (the job's OUT/token, written by `morph run`) or set MORPH_TOKEN"});
}

std::string createTokenFile(const std::string& path) {
  const std::string token = store::randomToken();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw InputError(path + ": cannot write the job token: " + std::strerror(errno));
  const std::string line = token + "\n";
  const bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) throw InputError(path + ": cannot write the job token");
  return token;
}

std::unique_ptr<StoreConnection> dialManager(const std::string& join, const std::string& token,
                                             const std::string& role, double timeout_s) {
  auto [host, port] = parseHostPort(join, "--join");
  try {
    return std::make_unique<StoreConnection>(host, port, token, role,
                                             std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  } catch (const StoreAuthError& e) {
    throw InputError("rejected job token (" + std::string(e.what()) +
                     "); use the token of the job running there (its OUT/token file)");
  } catch (const std::exception& e) {
    throw InputError("cannot reach the manager at " + join + " within " + std::to_string(static_cast<int>(timeout_s)) +
                     " s (" + e.what() + "); is `morph run` running there, and is the port open?");
  }
}

std::string text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace detail
}  // namespace morph
