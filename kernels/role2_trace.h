// What role2's task timeline (TaskTrace, recorded with LayerGraphOptions::trace_role2) says
// about one replay: per task kind, how long tasks waited for their inputs, queued behind the
// CTA's previous task and ran; the slowest tasks; when the CTAs ran out of tasks; the busiest
// SM. Host code; the CUDA backend logs it after every step with engine.cuda.trace_role2.
//
// It answers "where did the step's time go" without a profiler, which serializes kernels and
// cannot run the cross-rank waits of a multi-GPU step.
#pragma once

#include <span>
#include <string>

#include "kernels/layer_types.h"

namespace gcmoe::kernels {

// Times are microseconds from the earliest claim. Records with recorded == 0 (tasks no CTA
// reached, e.g. an aborted replay) are counted apart and otherwise ignored.
std::string SummarizeRole2Trace(std::span<const TaskTrace> trace);

}  // namespace gcmoe::kernels
