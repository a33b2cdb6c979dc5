// readTokenFrom (token_file.h).
#include "core/token_file.h"

#include <cctype>
#include <cstdlib>
#include <fstream>

#include "core/error.h"

namespace morph {

std::string readTokenFrom(const std::string& token_file, const TokenWords& words) {
  std::string token, from;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) throw InputError(words.unreadable + "--token-file " + token_file + ": cannot read it (" + words.origin + ")");
    std::getline(in, token);
    from = "--token-file " + token_file;
  } else if (const char* env = std::getenv("MORPH_TOKEN")) {
    token = env;
    from = "MORPH_TOKEN";
  } else {
    throw InputError(words.missing + ": " + words.how);
  }
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) throw InputError(words.missing + ": " + from + " is empty");
  return token;
}

}  // namespace morph
