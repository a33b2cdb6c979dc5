// The client commands: a person's (or a script's) requests to a running
// job, each over one short store connection in the client role, which the
// job's key policy lets write only ctl/ keys (docs/distributed.md, "Store
// keys"). The manager acts on them; they never wait for it to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace morph {

// Each returns the process exit code (0; bad input throws InputError: exit
// 2). join: HOST:PORT of the manager; token_file: the job token ("" =
// $MORPH_TOKEN).

// `morph resize`: asks the job to run on `workers`; `release` names workers
// (ids) it releases before any other when it shrinks (ResizeRequest).
int runResize(const std::string& join, int workers, const std::string& token_file, std::vector<int64_t> release = {});
// `morph status`: prints the manager's status record.
int runStatus(const std::string& join, const std::string& token_file);
// `morph slow`: asks worker `worker` to run `factor` times slower (1
// restores it); the manager relays it on gen/want (control/straggler.h).
int runSlow(const std::string& join, int64_t worker, double factor, const std::string& token_file);

}  // namespace morph
