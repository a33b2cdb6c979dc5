// A secret token given as `--token-file FILE` or in $MORPH_TOKEN: the job's
// (control/job_address.h, readToken) and the cluster scheduler's
// (sched/cluster_live.cpp) read it the same way, each with its own words.
#pragma once

#include <string>

namespace morph {

// What the messages of readTokenFrom say (InputError, exit 2):
//   no file and no $MORPH_TOKEN:  "<missing>: <how>"
//   a file that cannot be read:   "<unreadable><--token-file FILE>: cannot read it (<origin>)"
//   an empty token:               "<missing>: <--token-file FILE | MORPH_TOKEN> is empty"
struct TokenWords {
  std::string missing;     // "missing job token"
  std::string unreadable;  // what precedes "--token-file FILE" ("" or "missing job token: ")
  std::string origin;      // "the job's token is OUT/token of `morph run`"
  std::string how;         // "pass --token-file FILE (...) or set MORPH_TOKEN"
};

// The first line of `token_file` when given, else $MORPH_TOKEN, without
// trailing white space.
std::string readTokenFrom(const std::string& token_file, const TokenWords& words);

}  // namespace morph
