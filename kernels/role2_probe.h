// Timing probes of the bf16-wgmma role2 at BM 64 (bf16_wgmma_sm90.cuh): compile-time switches
// that drop one part of the kernel's work, so that the time a probe build saves is what that
// part costs ("variants that drop one stage", docs/PERFORMANCE.md, session 12). Set by the CMake
// option GCMOE_ROLE2_PROBE, a list of:
//   no-compute   consumers wait for each stage and release it: no decode, no wgmma
//   no-decode    the A registers are the raw lane words (no FP4 decode, no scale multiply)
//   no-wgmma     no wgmma (the decoded registers are kept alive, not multiplied)
//   no-tokens    the producer loads no token rows (the stages hold zeros)
//   half-tokens  the producer loads each stage's first K half of the token rows only (the other
//                holds zeros): the L2 reads that two CTAs sharing a token stage would leave
//   no-weights   the producer loads no weights (the stages hold zeros)
//   stages=N     N stages per CTA (2 up to the default)
// A probe build's outputs are wrong: `gcmoe bench layer` says so (GCMOE_ROLE2_PROBE_NAME, the
// list), and `gcmoe serve` and `gcmoe rank` refuse to start (RefuseProbeBuild). Never set in a real
// build.
#pragma once

namespace gcmoe::kernels {

struct Role2Probe {
  bool no_compute = false;
  bool no_decode = false;
  bool no_wgmma = false;
  bool no_tokens = false;
  bool half_tokens = false;
  bool no_weights = false;
  int stages = 0;  // 0: the default
};

inline constexpr Role2Probe kRole2Probe = {
#ifdef GCMOE_PROBE_NO_COMPUTE
    .no_compute = true,
#endif
#ifdef GCMOE_PROBE_NO_DECODE
    .no_decode = true,
#endif
#ifdef GCMOE_PROBE_NO_WGMMA
    .no_wgmma = true,
#endif
#ifdef GCMOE_PROBE_NO_TOKENS
    .no_tokens = true,
#endif
#ifdef GCMOE_PROBE_HALF_TOKENS
    .half_tokens = true,
#endif
#ifdef GCMOE_PROBE_NO_WEIGHTS
    .no_weights = true,
#endif
#ifdef GCMOE_PROBE_STAGES
    .stages = GCMOE_PROBE_STAGES,
#endif
};

}  // namespace gcmoe::kernels
