// How a member enters a generation it was placed in: the state every
// data-parallel member receives from the plan's source, and a pipeline
// member's stage, process groups and layers (from the job seed, a resume
// checkpoint, the members that hold them, or the checkpoint the manager
// names). Protocol: docs/distributed.md ("Generations", "Pipelines").
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "control/protocol/generation_plan.h"
#include "control/protocol/member_report.h"
#include "exec/pipeline.h"

namespace morph {

// Every member of a new generation receives the state of `source` (the
// member with the newest committed step): parameters, buffers, optimiser
// state, scale state and the step counter.
void syncState(StepCore& tr, Communicator& comm, int source);

// Joins a pipeline generation as world rank `rank`: places the stage and
// gives its layers their state, from the job seed or the resume checkpoint
// (the first generation), from the workers that hold them (a live morph:
// step counter and scale state broadcast from one member, then layers
// point to point), or from the checkpoint the manager names. Keeps `held`
// true at every point (a failure midway reports only what is still good)
// and returns what it measured for the manager's record of the morph.
// `held` counts layers only (HeldLayers::prepared is the core's).
nlohmann::json enterPipelineGeneration(StageExecutor& ex, const GenerationPlan& plan, int rank,
                                       std::vector<std::unique_ptr<Communicator>>& comms,
                                       const c10::intrusive_ptr<c10d::Store>& store, const std::string& gkey,
                                       const GlooOptions& go, HeldLayers& held, std::string& resume_ckpt,
                                       double rendezvous_s);

}  // namespace morph
