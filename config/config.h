// gcmoe's JSON configuration: schema, defaults, loading and validation.
//
// Validation reports every problem at once, one per line, each with its JSON path and the value
// expected: "model.hidden: expected a positive multiple of 32, got 100". Unknown keys are errors
// (a misspelt key must not silently fall back to a default).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::config {

struct ModelConfig {
  int hidden = 0;                         // model.hidden (H)
  int intermediate = 0;                   // model.intermediate (I)
  int experts = 0;                        // model.experts (E)
  int top_k = 0;                          // model.top_k
  int layers = 0;                         // model.layers
  int shared_intermediate = 0;            // model.shared_intermediate (0 = no shared expert)
  float activation_alpha = 1.0f;          // model.activation.alpha
  std::optional<float> activation_clamp;  // model.activation.clamp (null = none)
  float activation_up_offset = 0.0f;      // model.activation.up_offset: g*sigmoid(a g)*(u + this)
  // model.weights: "synthetic:SEED", a safetensors path, or "hf:DIR" (a Hugging Face
  // checkpoint directory, whose config.json then supplies every key above not given)
  std::string weights;
  // Not a key: with "hf:DIR", the model layer behind each MoE layer (dense layers are not
  // served); empty = MoE layer l is model layer l.
  std::vector<int> moe_layer_ids;
};

// What a checkpoint directory fixes about the model (model.weights "hf:DIR"). It is read by the
// engine's checkpoint reader, which config/ may not include: callers pass a CheckpointReader.
struct CheckpointModel {
  std::string source;  // "DIR/config.json", for messages
  int hidden = 0;
  int intermediate = 0;
  int experts = 0;
  int top_k = 0;
  int layers = 0;  // MoE layers
  int shared_intermediate = 0;
  float activation_alpha = 1.0f;
  std::optional<float> activation_clamp;
  float activation_up_offset = 0.0f;
  std::vector<int> moe_layer_ids;
  std::map<std::string, std::string> source_keys;  // "hidden" -> "hidden_size", ...
};
// weights ("hf:DIR") -> what its config.json says, or why it cannot be read.
using CheckpointReader = std::function<Result<CheckpointModel>(const std::string& weights)>;

struct ParallelConfig {
  int ranks = 1;                  // parallel.ranks
  std::vector<int> devices;       // parallel.devices: GPU per rank (cuda); default rank r: GPU r
  bool restart_ranks = true;      // parallel.restart_ranks: `serve` restarts a dead rank
  int restart_backoff_ms = 1000;  // parallel.restart_backoff_ms
};

// engine.cuda: settings of the CUDA backend that an operator may tune. Experiment-only switches
// (ablations) are flags of `gcmoe bench layer`, not config keys.
struct CudaEngineConfig {
  // engine.cuda.ring_blocks: token-ring slots per layer graph; 0 (default) = as many as the
  // largest step has blocks, so no slot is reused within a step. A small value saves memory at
  // a large max_tokens_per_rank and makes role1 wait for role2 to free slots.
  int ring_blocks = 0;
  // engine.cuda.role1_grid: dispatch CTAs when there is no dispatch partition; 0 = one per SM.
  int role1_grid = 0;
  // engine.cuda.overlap_roles: with a dispatch partition (engine.dispatch_sms > 0), whether
  // dispatch and the GEMM run overlapped: "auto" (overlapped on one GPU, in sequence with P > 1,
  // where overlapped steps measured slower), "on" or "off". Without a partition they always run
  // in sequence.
  std::string overlap_roles = "auto";
  // engine.cuda.wait_timeout_ms: a device spin wait (a peer, a role) gives up after this long and
  // the step fails with the name of what it waited for.
  int wait_timeout_ms = 5000;
  // engine.cuda.wait_sleep_cap_ns: the longest sleep between two polls of a spin wait (after its
  // first 32 polls). Shorter caps react faster but let hundreds of waiting CTAs steal issue slots
  // from the role they wait for.
  int wait_sleep_cap_ns = 4096;
  // engine.cuda.trace_role2: a diagnostic. Role2 records every task's timeline and each rank
  // logs after every step where role2's time went: waits, queueing and run times per task kind,
  // the slowest tasks, the busiest SM (kernels/role2_trace.h). Costs a few percent per step.
  bool trace_role2 = false;
};

struct EngineConfig {
  std::string backend = "cpu";     // engine.backend: "cpu" | "cuda"
  int threads = 0;                 // engine.threads: CPU worker threads per rank, 0 = auto
  int max_tokens_per_rank = 256;   // engine.max_tokens_per_rank: capacity of every buffer
  int exchange_timeout_ms = 2000;  // engine.exchange_timeout_ms: longest wait on a peer
  // engine.dispatch_sms (cuda): SMs asked for the dispatch green context, the GEMM on the rest;
  // 0 (the default) = no partition, dispatch then GEMM on every SM: measured faster than every
  // split on an H200, one GPU and two (docs/DESIGN-NOTES.md)
  int dispatch_sms = 0;
  // engine.exchange (cuda, P > 1): "gcmoe" (fused dispatch/combine over peer memory) | "nccl"
  // (baseline: NCCL all-to-all around the same grouped GEMM)
  std::string exchange = "gcmoe";
  CudaEngineConfig cuda;  // engine.cuda
};

struct BalancerConfig {
  bool enabled = false;               // balancer.enabled
  std::string topology = "ring";      // balancer.topology: "ring" | "cube" | "torus:AxB"
  int replicas_per_rank = 2;          // balancer.replicas_per_rank (D)
  int fractional_bits = 20;           // balancer.fractional_bits (F), the solver's fixed point
  std::optional<int> passes = 12;     // balancer.passes: a count, or "auto" (nullopt)
  std::string placement = "uniform";  // balancer.placement: "uniform" | "file" | "observed"
  std::string placement_file;         // balancer.placement_file: mean loads [layers][experts]
  int refit_steps = 0;                // balancer.refit_steps: refit every N steps ("observed")
};

// server.tls: TLS on the public port. cert and key together turn it on (PEM files); client_ca
// adds mTLS: a client must present a certificate that CA signed. Reloaded on SIGHUP.
struct TlsConfig {
  std::string cert;       // server.tls.cert: certificate chain (PEM)
  std::string key;        // server.tls.key: its private key (PEM)
  std::string client_ca;  // server.tls.client_ca: CA bundle for client certificates (mTLS)
};

// server.rank_tls: mutual TLS between the coordinator and its ranks. All three or none: the
// coordinator serves the rank port with cert/key and requires a rank certificate that ca signed;
// a rank presents its own cert/key and verifies the coordinator's against ca.
struct RankTlsConfig {
  std::string cert;  // server.rank_tls.cert
  std::string key;   // server.rank_tls.key
  std::string ca;    // server.rank_tls.ca
};

struct AuthConfig {
  // server.auth.tokens_file: one bearer token per line ('#' starts a comment); when set, every
  // MoeService call needs "authorization: Bearer TOKEN" metadata (health stays open).
  std::string tokens_file;
};

struct ServerConfig {
  std::string listen = "127.0.0.1:50051";   // server.listen (host:port)
  std::string rank_listen = "127.0.0.1:0";  // server.rank_listen: where ranks attach (0 = any)
  std::string coordinator;                  // server.coordinator: address ranks dial
  int64_t max_message_bytes = 0;            // server.max_message_bytes: 0 = derived from capacity
  // server.receive_quota_bytes: what the public port's transport may hold of requests still
  // streaming in, all connections together; a call beyond it is refused while it arrives.
  // 0 = max(2 x the message limit, 256 MiB): room for dozens of full-size calls in flight.
  int64_t receive_quota_bytes = 0;
  int default_deadline_ms = 30000;          // server.default_deadline_ms: when the client sets none
  int max_queue = 64;               // server.max_queue: Forward calls waiting for the engine
  int startup_timeout_ms = 120000;  // server.startup_timeout_ms: ranks must be ready by then
  int step_timeout_ms = 60000;      // server.step_timeout_ms: a step unanswered by then fails
  // server.rank_io: how a rank on the coordinator's host gets its shards and returns its outputs:
  // "auto" (shared memory the coordinator creates, pinned by the CUDA backend) or "inline" (in
  // the control stream's messages, as for ranks on other hosts, which always use it).
  std::string rank_io = "auto";
  // server.batch_window_us: how long a step waits for more Forward calls to merge with before it
  // starts. 0 (default): it merges only the calls already waiting, e.g. those that arrived while
  // the previous step ran.
  int batch_window_us = 0;
  // server.max_batch_calls: most Forward calls merged into one step (1 = no merging). A step also
  // never exceeds parallel.ranks x engine.max_tokens_per_rank tokens.
  int max_batch_calls = 64;
  // server.max_steps_in_flight: steps sent to the ranks at once. 2 (default): when every rank
  // is on the coordinator's host, the next step is sent while one runs, so a rank starts it as
  // soon as it is done; 1: one step at a time. Ranks on other hosts always get one at a time.
  int max_steps_in_flight = 2;
  // server.spin_wait: whether the threads on a step's path (a rank waiting for its next step, the
  // coordinator waiting for a step's results, its idle copy threads) spin for up to a
  // millisecond, yielding their core, before they sleep: an answer within the spin is seen in
  // about a microsecond instead of a sleeping thread's wake-up (tens of microseconds), and a copy
  // starts on every copy thread at once. "auto" (default): on with the cuda backend,
  // whose ranks leave their cores idle while the GPU works; off with the cpu backend, whose
  // compute needs every core. "on", "off": always, never.
  std::string spin_wait = "auto";
  // server.copy_threads: threads that share the coordinator's work on a call's bytes once there
  // are at least 256 KiB of it (the activations' checks, the shards' copies into the ranks'
  // regions, the outputs' copies back and checks). 0 (default): a quarter of the cores, 1 to 4
  // (so 1, no helpers, on up to 7 cores); 1: the calling thread alone.
  int copy_threads = 0;
  // server.echo: serve the Echo method (the transport floor `gcmoe bench serve` measures).
  bool echo = false;
  // server.allow_registered_memory: serve RegisterMemory and Forward tensors that name a
  // registered POSIX shared-memory region instead of carrying their bytes. Off by default: a
  // registration maps a client's shared memory into the coordinator, which only a co-located,
  // trusted frontend should be able to ask for.
  bool allow_registered_memory = false;
  // server.metrics_listen: host:port of the Prometheus /metrics endpoint; "" = none.
  std::string metrics_listen = "127.0.0.1:9464";
  TlsConfig tls;           // server.tls
  RankTlsConfig rank_tls;  // server.rank_tls
  AuthConfig auth;         // server.auth
  // server.rank_secret_file: the attach secret a rank proves it holds before the coordinator
  // looks at anything else it says; a file only its owner may read or write. Empty: `gcmoe serve`
  // creates one for its own ranks in a private directory; `coordinator` and `rank` refuse to
  // start without one.
  std::string rank_secret_file;
};

struct LoggingConfig {
  std::string level = "info";   // logging.level: trace|debug|info|warn|error
  std::string format = "text";  // logging.format: "text" | "json"
  std::string file;             // logging.file: empty = stderr
  // Failed calls are logged one line each up to failures_per_interval per interval; the rest of
  // an interval's failures become one summary line with their counts by status code.
  int failure_interval_ms = 1000;  // logging.failure_interval_ms
  int failures_per_interval = 10;  // logging.failures_per_interval (0 = summaries only)
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  EngineConfig engine;
  BalancerConfig balancer;
  ServerConfig server;
  LoggingConfig logging;
  std::string source;  // the file it came from, or "<embedded default>"

  // Digest of what every process of one service must agree on (model, parallel, engine,
  // balancer); the coordinator refuses a rank whose digest differs.
  std::string Digest() const;
  // Canonical JSON with every default filled in.
  std::string ToJson() const;
  // Largest number of tokens one Forward may carry: ranks * max_tokens_per_rank.
  int max_tokens() const { return parallel.ranks * engine.max_tokens_per_rank; }
};

// The embedded default (config/examples/tiny-cpu.json compiled into the binary).
Config DefaultConfig();
const std::string& DefaultConfigText();

// overrides: "key.path=value" strings applied before validation (value parsed as JSON, or as a
// string when it is not valid JSON), e.g. "parallel.ranks=4", "server.listen=0.0.0.0:5000".
// A bad config is INVALID_ARGUMENT with one problem per line ("path: expected X, got Y"; JSON
// syntax errors as "line L, column C: invalid JSON: ..."); messages do not name the source, so
// callers prefix it. LoadConfigFile: NOT_FOUND when the file cannot be read.
// With model.weights "hf:DIR" and a `checkpoint` reader, the model keys not given come from the
// checkpoint and those given must agree with it ("model.hidden: expected 2880 (hidden_size in
// DIR/config.json), got 2048"); without a reader they are required as for any other weights.
Result<Config> ParseConfig(const std::string& json_text, const std::string& source_name,
                           const std::vector<std::string>& overrides = {},
                           const CheckpointReader& checkpoint = {});
Result<Config> LoadConfigFile(const std::string& path,
                              const std::vector<std::string>& overrides = {},
                              const CheckpointReader& checkpoint = {});

// The extra rules of split mode, where `gcmoe coordinator` and each `gcmoe rank` start apart
// (systemd's split units, Kubernetes) and ranks find the coordinator from the config alone:
// server.rank_listen needs a fixed port, and a wildcard host needs server.coordinator.
// INVALID_ARGUMENT with one problem per line, like ParseConfig. `gcmoe serve` does not need
// them: it passes the bound address to the ranks it starts.
Status CheckSplitMode(const Config& config);

}  // namespace gcmoe::config
