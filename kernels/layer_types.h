// Types shared by the host side and the three role kernels of one GC-MoE layer replay
// (DESIGN.md §6): the layer's dimensions, the per-step tables the host writes before a step,
// the device-persistent signals, the by-value peer table and the parameter block every role
// kernel receives by value (so a captured graph node carries it, no pointer chasing).
//
// Plain structs only: this header is included by CUDA and by host C++ (the engine adapter).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/wait_backoff.h"

namespace gcmoe::kernels {

// Ranks one by-value peer table can name (the paper's table holds 72; one NVLink domain of
// H200s is 8).
inline constexpr int kMaxRanks = 8;
// Token block sizes (rows of a ring block) the grouped GEMM is instantiated for: BM = 8 * NT.
inline constexpr int kBlockSizes[] = {8, 16, 32, 64};
inline constexpr int kNumBlockSizes = 4;
// Threads of every role kernel.
inline constexpr int kRoleThreads = 256;
// The grouped GEMM's fixed tile: 64 weight rows (W1: 32 gate + 32 up features; W2: 64 hidden
// features) by the block's tokens, contraction in chunks of 128.
inline constexpr int kTileRows = 64;
inline constexpr int kChunkK = 128;

enum InputDType : int32_t { kInBF16 = 0, kInFP32 = 1, kInFP16 = 2, kInFP8 = 3 };

struct LayerDims {
  int32_t hidden = 0;               // H
  int32_t intermediate = 0;         // I (routed)
  int32_t shared_intermediate = 0;  // I_s, 0 = no shared expert
  int32_t num_experts = 0;          // E (global)
  int32_t local_experts = 0;        // routed experts held by this rank (local slots)
  int32_t top_k = 0;                // k
  int32_t capacity = 0;             // max tokens per rank
  int32_t world_size = 1;           // P
  int32_t rank = 0;
  int32_t has_clamp = 0;
  float alpha = 1.0f;
  float clamp = 0.0f;
  float up_offset = 0.0f;  // o in h = g' sigmoid(alpha g') (u' + o) w (DESIGN.md §4 step 3)
  int32_t has_biases = 0;  // the weights have expert biases (StepHeader::b1 / b2)
};

// Whether role2 runs its instances with the extended epilogue: expert biases and the up offset
// (gemm_epilogue_sm90.cuh). Without either, the default instances.
GCMOE_HOST_DEVICE constexpr bool ExtendedEpilogue(const LayerDims& d) {
  return d.has_biases != 0 || d.up_offset != 0.0f;
}

// role2's tasks in a step (role2_tasks_sm90.cuh hands them out): per routed block its W1 tiles
// (32 SwiGLU features each, I/32) and W2 tiles (H/64); per shared-expert block the same over I_s;
// `tiles_per_task` adjacent tiles each (LayerParams::r2_tiles_per_task; every count is even).
GCMOE_HOST_DEVICE constexpr int64_t Role2TaskCount(const LayerDims& d, int64_t blocks,
                                                   int64_t shared_blocks, int tiles_per_task = 1) {
  const int64_t w2_tiles = d.hidden / kTileRows;
  const int64_t shared = d.shared_intermediate > 0 ? shared_blocks : 0;
  return (blocks * (d.intermediate / 32 + w2_tiles) +
          shared * (d.shared_intermediate / 32 + w2_tiles)) /
         tiles_per_task;
}

// One row of the receive index and of a ring block's metadata: which source token and slot a
// row carries and its routing weight. 16 bytes so a lane moves it with one vector access.
struct RowMeta {
  int32_t token;
  int32_t slot;  // 0..k-1 routed, k = shared expert
  int32_t src_rank;
  float weight;
};

// A logical ring block: BM rows of one local expert, taken from the receive index.
struct RingBlock {
  int32_t local_slot;  // which held expert (index into the layer's tiled weights)
  int32_t row_begin;   // first row in the receive index
  int32_t rows;        // 1..BM valid rows
  // Role2 of the wgmma kernel (BM 64) only (else 0): > 0 on a full block whose tasks also compute
  // the next block, its expert's last, of tail_rows <= kWgmmaMaxTailRows rows; -1 on that
  // tail block, whose own role2 tasks are skipped. Role1 and role3 treat both as plain blocks.
  int32_t tail_rows;
};

// role1 fills a ring block in `parts` pieces of its rows, one CTA each, when the step has fewer
// blocks than role1 has CTAs: with one CTA per block, GLM-5.2 T = 256 (45 blocks on 132 CTAs)
// took 66 us in role1. ring_full[slot] counts the pieces: generation g of a
// slot (logical block g * R + slot) is complete once it reaches (g + 1) * parts. Every role that
// fills or awaits a slot derives `parts` from the step's block count and role1's grid. (With
// direct rows role1 adds all `parts` of a block at once: StepHeader::direct_rows.)
inline constexpr int kMaxPullParts = 16;
GCMOE_HOST_DEVICE constexpr int PullParts(int num_blocks, int role1_grid) {
  if (num_blocks <= 0) return 1;
  const int parts = role1_grid / num_blocks;
  return parts < 1 ? 1 : parts > kMaxPullParts ? kMaxPullParts : parts;
}
GCMOE_HOST_DEVICE constexpr uint32_t RingFullTarget(int block, int ring_blocks, int parts) {
  return static_cast<uint32_t>(block / ring_blocks + 1) * static_cast<uint32_t>(parts);
}

// Where expert e's assignments go: positions [0, home_tokens) to home_rank, the rest to
// host_rank; each target appends them to its receive index from the given base (the bases
// are the targets' own, identical on every rank).
struct ExpertRoute {
  int32_t home_rank;
  int32_t home_base;
  int32_t host_rank;  // -1 when not replicated
  int32_t host_base;
  int32_t home_tokens;
  int32_t src_offset;   // this rank's first position in e's global order (plan.src_offset)
  int32_t first_block;  // this rank's first ring block of e (when it computes a share of e)
  // NCCL all-to-all baseline: index in this rank's send records of its first assignment of e
  // that goes to the home copy, and of the first that goes to the host copy.
  int32_t send_home;
  int32_t send_host;
  int32_t pad[3];
};

// Written by the host before each step (never during a replay); every role reads it on device,
// so one captured graph serves every token count up to the capacity and every layer.
struct StepHeader {
  uint64_t generation;        // the step's generation: Abort(g) stops steps with generation <= g
  int32_t num_tokens;         // T_r
  int32_t in_dtype;           // InputDType
  int32_t out_fp32;           // else BF16
  int32_t num_blocks;         // routed ring blocks this rank computes
  int32_t num_shared_blocks;  // ceil(T_r / BM) with a shared expert, else 0
  int32_t a2a_send_rows;      // NCCL all-to-all baseline: records this rank sends (all ranks)
  int32_t a2a_recv_rows;      // ... and receives (all ranks, itself included)
  // 1: role1 writes every assignment's BF16 row straight into its ring row
  // (LayerParams::direct_rows) and fills no ring block by pieces (one rank, no slot
  // reused within the step).
  int32_t direct_rows;
  // The step's layer: tiled weights (weight_tiles_sm90.h), all held experts back to back.
  const uint8_t* w1;   // [local_experts][I/32 tiles]
  const uint8_t* w2;   // [local_experts][H/64 tiles]
  const uint8_t* ws1;  // shared W1, [I_s/32 tiles] (null without a shared expert)
  const uint8_t* ws2;  // shared W2, [H/64 tiles]
  // role2: per held expert the power of two its W1 and W2 block
  // scales were divided by at load so that every scale multiplier stays in BF16's range,
  // [local_experts][W1, W2], then the shared expert's [W1, W2]. A task multiplies its FP32
  // results by 2^shift (exact).
  const int32_t* scale_shift;
  // Expert biases (DESIGN.md §4 steps 2 and 4), FP32, or both null for a model without them:
  // b1 in W1's tile row order ([local_experts][I/32 tiles][32 gate, 32 up]), b2 [local_experts][H].
  const float* b1;
  const float* b2;
};

// Scalar signals, device-persistent across replays. Invariant at the start of every replay:
// every counter below is 0 except `parity` and `replays`. Role3's last CTA restores it.
struct Signals {
  uint32_t r1_arrive;         // role1 CTAs past their local work (grid barrier), reset by role3
  uint32_t x_ready;           // role1 -> role2: local activations quantized (shared expert may go)
  uint32_t task_next;         // role2's task cursor, reset by role3
  uint32_t r3_done;           // role3 CTAs finished (the last one resets), reset by itself
  uint32_t parity;            // this replay's parity; role3 flips it
  uint32_t replays;           // completed replays, for diagnostics only
  uint32_t tag1[2];           // cross-rank dispatch barrier by parity: each rank adds 1
  uint32_t combine_ready[2];  // cross-rank combine readiness by parity: each rank adds 1
};

// By-value peer table: the addresses of every rank's exchanged buffers as this rank maps them
// (its own entry is its own buffers).
struct PeerTable {
  const uint8_t* x_q[kMaxRanks];  // [capacity, H] quantized activations of each source rank
  const uint8_t* x_s[kMaxRanks];  // [capacity, H/32]
  RowMeta* recv[kMaxRanks];       // receive index of each target rank
  uint16_t* combine[kMaxRanks];   // [capacity, k+1, H] BF16 partials of each source rank
  Signals* signals[kMaxRanks];
};

// NCCL all-to-all baseline: one dispatched assignment as it travels, a header then the
// token's E4M3 codes [H] and scales [H/32], padded to 16 bytes (A2aRecordBytes).
struct A2aRecordHeader {
  RowMeta meta;        // token, slot and source rank at the source, routing weight
  int32_t recv_index;  // its row in the computing rank's receive order
  int32_t expert;
  int32_t dst;  // the computing rank
  int32_t pad;
};

inline GCMOE_HOST_DEVICE int64_t A2aRecordBytes(int hidden) {
  return (static_cast<int64_t>(sizeof(A2aRecordHeader)) + hidden + hidden / 32 + 15) / 16 * 16;
}

// What a wait that timed out was waiting for; written to host-mapped memory before the trap so
// the host can name it in its error even when device printf output is lost.
struct WaitDiagnostic {
  int32_t timed_out;  // 1 once a wait expired
  int32_t role;       // 1, 2 or 3
  int32_t what;       // WaitWhat
  int32_t index;      // block / slot / rank index
  uint32_t target;
  uint32_t seen;
  uint32_t replay;
  int32_t pad;
  // Role3's end-of-replay checks of role2's bookkeeping (a replay that was not aborted): every
  // task claimed exactly once and every routed block's W1 tiles all counted. A broken check
  // means work was skipped or double-counted, so the step's output cannot be trusted.
  int32_t broken;        // 0, or a WaitWhat below (kCheck*)
  int32_t broken_index;  // the block, for kCheckW1Tiles
  uint32_t broken_expected;
  uint32_t broken_seen;
};

enum WaitWhat : int32_t {
  kWaitRole1Barrier = 1,  // role1 CTAs' grid barrier (r1_arrive)
  kWaitTag1 = 2,          // cross-rank dispatch barrier
  kWaitRingEmpty = 3,     // role1 waits for role2 to release a ring slot
  kWaitRingFull = 4,      // role2 waits for role1 to fill a ring block
  kWaitXReady = 5,        // role2 (shared expert) waits for the quantized activations
  kWaitW1Done = 6,        // role2 W2 task waits for its block's W1 tiles
  kWaitSharedW1Done = 7,  // role2 shared W2 task waits for the shared W1 tiles
  kWaitCombine = 8,       // role3 waits for every rank's partials
  kWaitPipeline = 9,      // role2's shared-memory pipeline (index: barrier; seen: thread)
  kCheckTaskClaims = 10,  // role2's task cursor after the replay: tasks + one claim per CTA
  kCheckW1Tiles = 11,     // a routed block's W1 tiles counted after the replay
};

// Names a wait for diagnostics (device printf and the host's error message).
inline GCMOE_HOST_DEVICE const char* WaitWhatName(int what) {
  switch (what) {
    case kWaitRole1Barrier:
      return "the role1 grid barrier";
    case kWaitTag1:
      return "the cross-rank dispatch barrier (tag 1) of every rank";
    case kWaitRingEmpty:
      return "role2 to release ring slot";
    case kWaitRingFull:
      return "role1 to fill ring block";
    case kWaitXReady:
      return "role1 to quantize the activations, for shared block";
    case kWaitW1Done:
      return "the W1 tiles of ring block";
    case kWaitSharedW1Done:
      return "the shared W1 tiles of block";
    case kWaitCombine:
      return "every rank's partials (combine readiness)";
    case kWaitPipeline:
      return "role2's shared-memory pipeline barrier";
    case kCheckTaskClaims:
      return "role2's task claims (tasks + one per CTA)";
    case kCheckW1Tiles:
      return "the W1 tiles counted for block";
    default:
      return "an unknown signal";
  }
}

// role2's task kinds, in the order the scheduler hands them out (role2_tasks_sm90.cuh).
enum TaskKind { kSharedW1 = 0, kRoutedW1 = 1, kSharedW2 = 2, kRoutedW2 = 3 };

// One role2 task's timeline (%globaltimer ns), recorded when LayerGraphOptions::trace_role2
// is on, at the task's index: claimed by CTA `cta` on SM `sm`, its inputs ready (the flag
// wait ended), its mainloop started (after any task queued before it in the CTA), done (its
// outputs stored, before the release of W1 completion).
struct TaskTrace {
  uint32_t cta;
  uint32_t sm;
  uint32_t kind;      // TaskKind
  uint32_t recorded;  // 1 once written this replay
  uint64_t claim_ns;
  uint64_t ready_ns;
  uint64_t start_ns;
  uint64_t done_ns;
};

// A TMA tensor map (CUtensorMap: 128 opaque bytes, 128-aligned; tma_map.h encodes it).
struct alignas(128) TmaMap {
  uint64_t opaque[16];
};
// role2's BF16 activation matrices as TMA maps (LayerParams::act_maps).
enum ActMap : int32_t { kMapRing = 0, kMapH = 1, kMapXbf = 2, kMapHs = 3, kNumActMaps = 4 };

struct LayerParams {
  LayerDims dims;
  PeerTable peers;
  int32_t bm = 8;                 // rows per ring block (the graph's instantiation)
  int32_t ring_blocks = 1;        // R ring slots; logical block b uses slot b % R, generation b / R
  int32_t max_blocks = 0;         // logical blocks the per-block arrays hold
  int32_t sequential = 0;         // 1: roles run one after the other (no spin can block)
  uint64_t timeout_ns = 0;        // every device wait gives up (and traps) after this long
  int32_t role1_grid = 0;         // role1's CTAs (role2's SM log entries follow role1's)
  int32_t role2_grid = 0;         // role2's CTAs (role3 checks the task claims against it)
  int32_t r2_stages = 0;          // shared-memory stages of role2's pipeline
  int32_t r2_tiles_per_task = 1;  // Role2TilesPerTask of the graph's BM
  // ring, h_q and hs_q hold BF16 rows (2 bytes per value, each 32-value block in the K order
  // this value names, kBf16MmaOrder or kBf16WgmmaOrder: bf16_operands.h, Bf16ActOrder), and so
  // does x_bf (role1's pull copies this rank's own tokens' rows from it; the shared expert reads
  // it). x_q / x_s (what peers read) stay E4M3.
  int32_t act_bf16 = 0;
  // The spin waits' longest sleep between two polls (wait_backoff.h).
  uint32_t wait_sleep_ns = kDefaultWaitSleepNs;

  const StepHeader* header;
  const RingBlock* blocks;    // [max_blocks]
  const ExpertRoute* routes;  // [E]
  // Step inputs (device copies of the request shard).
  const void* hidden_in;            // [T, H] in header->in_dtype
  const uint8_t* hidden_scales_in;  // [T, H/32], FP8 input only
  const int32_t* topk_ids;          // [T, k]
  const float* topk_weights;        // [T, k]
  // With header->direct_rows: each assignment's ring row (block * BM + row, as meta), or -1.
  const int32_t* direct_rows;  // [T, k]
  // This rank's buffers (peers reach theirs through `peers`).
  uint8_t* x_q;          // [capacity + 64, H]
  uint8_t* x_s;          // [capacity + 64, H/32]
  uint16_t* x_bf;        // [capacity + 64, H] BF16, this rank's tokens
  RowMeta* recv;         // [max_recv_rows]
  uint8_t* ring;         // [R * BM, H] BF16
  RowMeta* meta;         // [max_blocks * BM]
  uint8_t* h_q;          // [max_blocks * BM, I] BF16    W1 output (E4M3 values, exact in BF16)
  uint8_t* hs_q;         // [capacity + 64, I_s] BF16    shared W1 output
  uint16_t* combine;     // [capacity, k+1, H] BF16
  void* out;             // [capacity, H] BF16 or FP32
  Signals* sig;
  uint32_t* ring_full;   // [R] pieces filled into the slot, over generations (PullParts)
  uint32_t* ring_empty;  // [R] W1 tiles finished reading the slot, summed over generations
  uint32_t* w1_done;     // [max_blocks] W1 tiles finished per logical block
  uint32_t* w1s_done;    // [max shared blocks] shared W1 tiles finished per block
  const volatile uint64_t* abort_generation;  // host-mapped; >= header->generation: leave
  WaitDiagnostic* diag;                       // host-mapped
  int32_t* smid_log;      // optional [role1 grid + role2 grid]: the SM each CTA ran on
  TaskTrace* task_trace;  // optional [task_trace_cap]: role2's task timeline
  int32_t task_trace_cap;
  // NCCL all-to-all baseline only (else null).
  uint8_t* a2a_send;       // [capacity * k] records, grouped by destination rank
  uint8_t* a2a_recv;       // [world * capacity * k] records, grouped by source rank
  uint16_t* a2a_ret_send;  // [world * capacity * k, H] partials of the received records
  uint16_t* a2a_ret_recv;  // [capacity * k, H] partials of the sent records, in send order
  // role2: device [kNumActMapSets], ring, h_q, x_bf and hs_q as TMA maps (tma_map.h): per matrix
  // with K32 boxes of 8, 16, .. 64 rows (the mma.sync kernel, K32ActMap), then per matrix with
  // K64 boxes of 16, 32, 48 and 64 rows (the wgmma kernel, WideActMap). Written by the host
  // before any launch. In device memory, not here: 1 KiB more of parameters cost every launch
  // (BM 8 steps 1-4 % slower).
  const TmaMap* act_maps;
};

}  // namespace gcmoe::kernels
