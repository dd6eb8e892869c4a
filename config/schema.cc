// The per-key schema: every section's keys, their types, defaults (those of config.h) and rules.
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <optional>

#include "config/object_reader.h"
#include "config/schema.h"

namespace gcmoe::config::internal {
namespace {

using nlohmann::json;

bool AllDigits(const std::string& s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

constexpr IntRule kPositive{.min = 1, .expected = "a positive integer"};
constexpr IntRule kNonNegative{.min = 0, .expected = "a non-negative integer"};
constexpr IntRule kPositiveMs{.min = 1, .expected = "a positive integer (milliseconds)"};
// Block scaling quantizes H and I in blocks of 32 (DESIGN.md §4). The upper bounds are the
// checkpoint reader's (engine/hf_checkpoint.h): a mistyped size is refused by key instead of
// sizing weights and workspaces by it.
constexpr IntRule kMultipleOf32{.min = 1,
                                .max = 1 << 20,
                                .multiple_of = 32,
                                .expected = "a positive multiple of 32 up to 1048576"};
constexpr IntRule kExpertsOrLayers{
    .min = 1, .max = 1 << 16, .expected = "a positive integer up to 65536"};

std::string FloatText(float v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", static_cast<double>(v));
  return text;
}

// With "hf:DIR" weights: the checkpoint's value where the key is absent; where it is present,
// the two must agree, and the problem names both.
class CheckpointAgreement {
 public:
  CheckpointAgreement(const CheckpointModel* checkpoint, Problems* problems)
      : checkpoint_(checkpoint), problems_(problems) {}

  bool active() const { return checkpoint_ != nullptr; }

  template <typename T>
  void Settle(const std::string& path, const char* field, bool given, T checkpoint_value, T* value,
              const std::string& text_of_checkpoint, const std::string& text_of_given) {
    if (checkpoint_ == nullptr) return;
    if (!given) {
      *value = checkpoint_value;
      return;
    }
    if (*value == checkpoint_value) return;
    const auto key = checkpoint_->source_keys.find(field);
    problems_->Expected(
        path,
        text_of_checkpoint + " (" +
            (key == checkpoint_->source_keys.end() ? std::string(field) : key->second) + " in " +
            checkpoint_->source + "), or leave the key out",
        text_of_given);
  }

 private:
  const CheckpointModel* checkpoint_;
  Problems* problems_;
};

void ReadModel(ObjectReader r, ModelConfig* m, const CheckpointReader& reader) {
  r.String("weights", "\"synthetic:SEED\", \"hf:DIR\" or a safetensors file path", IsWeightsSpec,
           &m->weights, true);
  std::optional<CheckpointModel> checkpoint;
  if (m->weights.rfind("hf:", 0) == 0 && reader) {
    Result<CheckpointModel> read = reader(m->weights);
    if (read.ok()) {
      checkpoint = std::move(read).value();
      m->moe_layer_ids = checkpoint->moe_layer_ids;
    } else {
      r.problems()->Add(r.PathOf("weights"), read.status().message());
    }
  }
  // Without a readable checkpoint the shape keys are required as for any other weights.
  const bool required = !checkpoint.has_value();
  CheckpointAgreement agree(checkpoint ? &*checkpoint : nullptr, r.problems());
  auto int_key = [&](const char* key, const IntRule& rule, int* out, int CheckpointModel::*field,
                     bool may_be_required = true) {
    const bool given = r.Int(key, rule, out, required && may_be_required);
    if (checkpoint) {
      const int value = (*checkpoint).*field;
      agree.Settle(r.PathOf(key), key, given, value, out, std::to_string(value),
                   std::to_string(*out));
    }
  };
  int_key("hidden", kMultipleOf32, &m->hidden, &CheckpointModel::hidden);
  int_key("intermediate", kMultipleOf32, &m->intermediate, &CheckpointModel::intermediate);
  int_key("experts", kExpertsOrLayers, &m->experts, &CheckpointModel::experts);
  int_key("top_k", kPositive, &m->top_k, &CheckpointModel::top_k);
  int_key("layers", kExpertsOrLayers, &m->layers, &CheckpointModel::layers);
  int_key("shared_intermediate",
          {.min = 0,
           .max = 1 << 20,
           .multiple_of = 32,
           .expected = "0 (no shared expert) or a positive multiple of 32 up to 1048576"},
          &m->shared_intermediate, &CheckpointModel::shared_intermediate,
          /*may_be_required=*/false);

  ObjectReader activation = r.Object("activation", "an object with alpha, clamp and up_offset");
  const bool alpha_given = activation.PositiveFloat("alpha", &m->activation_alpha);
  if (checkpoint) {
    agree.Settle(activation.PathOf("alpha"), "alpha", alpha_given, checkpoint->activation_alpha,
                 &m->activation_alpha, FloatText(checkpoint->activation_alpha),
                 FloatText(m->activation_alpha));
  }
  const std::string clamp_expected = "a positive number or null";
  const json* clamp = activation.Raw("clamp", clamp_expected);
  if (clamp != nullptr) {
    const double d = clamp->is_number() ? clamp->get<double>() : 0.0;
    if (clamp->is_null()) {
      m->activation_clamp.reset();
    } else if (clamp->is_number() && d > 0.0 && std::isfinite(d) && d <= FLT_MAX) {
      m->activation_clamp = static_cast<float>(d);
    } else {
      r.problems()->Expected(activation.PathOf("clamp"), clamp_expected, Describe(*clamp));
    }
  }
  if (checkpoint) {
    auto text = [](const std::optional<float>& c) { return c ? FloatText(*c) : "null"; };
    agree.Settle(activation.PathOf("clamp"), "clamp", clamp != nullptr,
                 checkpoint->activation_clamp, &m->activation_clamp,
                 text(checkpoint->activation_clamp), text(m->activation_clamp));
  }
  const std::string offset_expected = "a finite number (0 = plain SwiGLU)";
  const json* offset = activation.Raw("up_offset", offset_expected);
  if (offset != nullptr) {
    if (offset->is_number() && std::isfinite(offset->get<double>()) &&
        std::fabs(offset->get<double>()) <= FLT_MAX) {
      m->activation_up_offset = offset->get<float>();
    } else {
      r.problems()->Expected(activation.PathOf("up_offset"), offset_expected, Describe(*offset));
    }
  }
  if (checkpoint) {
    agree.Settle(activation.PathOf("up_offset"), "up_offset", offset != nullptr,
                 checkpoint->activation_up_offset, &m->activation_up_offset,
                 FloatText(checkpoint->activation_up_offset), FloatText(m->activation_up_offset));
  }
  activation.Finish();
  r.Finish();
}

void ReadParallel(ObjectReader r, ParallelConfig* p) {
  // ranks * engine.max_tokens_per_rank must fit an int (Config::max_tokens).
  r.Int("ranks", {.min = 1, .max = 1024, .expected = "an integer in 1..1024"}, &p->ranks);
  const std::string devices_expected = "a list of GPU indices, one per rank";
  if (const json* devices = r.Raw("devices", devices_expected)) {
    if (!devices->is_array()) {
      r.problems()->Expected(r.PathOf("devices"), devices_expected, Describe(*devices));
    } else {
      p->devices.clear();
      for (size_t i = 0; i < devices->size(); ++i) {
        const json& d = (*devices)[i];
        const std::string path = r.PathOf("devices") + "[" + std::to_string(i) + "]";
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > INT32_MAX) {
          r.problems()->Expected(path, "a non-negative integer (a GPU index)", Describe(d));
        } else {
          p->devices.push_back(d.get<int>());
        }
      }
    }
  }
  r.Bool("restart_ranks", &p->restart_ranks);
  r.Int("restart_backoff_ms", {.min = 0, .expected = "a non-negative integer (milliseconds)"},
        &p->restart_backoff_ms);
  r.Finish();
}

void ReadCudaEngine(ObjectReader r, CudaEngineConfig* c) {
  r.Int("ring_blocks",
        {.min = 0, .max = 1 << 20, .expected = "an integer in 0..1048576 (0 = no slot reuse)"},
        &c->ring_blocks);
  r.Int("role1_grid",
        {.min = 0, .max = 1 << 16, .expected = "an integer in 0..65536 (0 = one CTA per SM)"},
        &c->role1_grid);
  r.OneOf("overlap_roles", {"auto", "on", "off"}, &c->overlap_roles);
  r.Int("wait_timeout_ms",
        {.min = 1, .max = 3600000, .expected = "an integer in 1..3600000 (milliseconds)"},
        &c->wait_timeout_ms);
  // The floor is the backoff's short cap (kernels/wait_backoff.h, kShortWaitSleepNs).
  r.Int("wait_sleep_cap_ns",
        {.min = 512, .max = 1000000, .expected = "an integer in 512..1000000 (nanoseconds)"},
        &c->wait_sleep_cap_ns);
  r.Bool("trace_role2", &c->trace_role2);
  r.Finish();
}

void ReadEngine(ObjectReader r, EngineConfig* e) {
  r.OneOf("backend", {"cpu", "cuda"}, &e->backend);
  r.Int("threads", {.min = 0, .expected = "a non-negative integer (0 = auto)"}, &e->threads);
  r.Int("max_tokens_per_rank", {.min = 1, .max = 1 << 20, .expected = "an integer in 1..1048576"},
        &e->max_tokens_per_rank);
  r.Int("exchange_timeout_ms", kPositiveMs, &e->exchange_timeout_ms);
  r.Int("dispatch_sms",
        {.min = 0, .expected = "a non-negative integer (0 = no dispatch partition)"},
        &e->dispatch_sms);
  r.OneOf("exchange", {"gcmoe", "nccl"}, &e->exchange);
  ReadCudaEngine(r.Object("cuda", "an object"), &e->cuda);
  r.Finish();
}

void ReadBalancer(ObjectReader r, BalancerConfig* b) {
  r.Bool("enabled", &b->enabled);
  r.String(
      "topology", "\"ring\", \"cube\" or \"torus:AxB\"",
      [](const std::string& s) { return ParseTopology(s); }, &b->topology);
  r.Int("replicas_per_rank", kNonNegative, &b->replicas_per_rank);
  // Loads are fixed point with F fractional bits; 16 keeps a step's largest load (well under
  // 2^15 assignments per rank) inside 31 bits.
  r.Int("fractional_bits", {.min = 0, .max = 30, .expected = "an integer in 0..30"},
        &b->fractional_bits);
  const std::string passes_expected = "a positive integer or \"auto\"";
  if (const json* passes = r.Raw("passes", passes_expected)) {
    if (passes->is_string() && passes->get<std::string>() == "auto") {
      b->passes.reset();
    } else if (passes->is_number_integer() && passes->get<int64_t>() >= 1 &&
               passes->get<int64_t>() <= INT32_MAX) {
      b->passes = passes->get<int>();
    } else {
      r.problems()->Expected(r.PathOf("passes"), passes_expected, Describe(*passes));
    }
  }
  r.OneOf("placement", {"uniform", "file", "observed"}, &b->placement);
  r.String("placement_file", "a file path", {}, &b->placement_file);
  r.Int("refit_steps", kNonNegative, &b->refit_steps);
  r.Finish();
}

void ReadServer(ObjectReader r, ServerConfig* s) {
  r.String("listen", "host:port", IsHostPort, &s->listen);
  r.String("rank_listen", "host:port", IsHostPort, &s->rank_listen);
  r.String(
      "coordinator", "host:port or \"\" (none)",
      [](const std::string& v) { return v.empty() || IsHostPort(v); }, &s->coordinator);
  // gRPC sizes messages with an int.
  r.Int64("max_message_bytes",
          {.min = 0,
           .max = INT32_MAX,
           .expected = "0 (derived from capacity) or a byte count up to 2147483647"},
          &s->max_message_bytes);
  r.Int64("receive_quota_bytes",
          {.min = 0,
           .max = int64_t{1} << 40,
           .expected = "0 (2 x the message limit, at least 256 MiB) or a byte count up to 2^40"},
          &s->receive_quota_bytes);
  r.Int("default_deadline_ms", kPositiveMs, &s->default_deadline_ms);
  r.Int("max_queue", kPositive, &s->max_queue);
  r.Int("startup_timeout_ms", kPositiveMs, &s->startup_timeout_ms);
  r.Int("step_timeout_ms", kPositiveMs, &s->step_timeout_ms);
  r.OneOf("rank_io", {"auto", "inline"}, &s->rank_io);
  r.Int("batch_window_us", {.min = 0, .max = 1000000, .expected = "an integer in 0..1000000 (microseconds)"},
        &s->batch_window_us);
  r.Int("max_batch_calls", {.min = 1, .max = 4096, .expected = "an integer in 1..4096"},
        &s->max_batch_calls);
  r.Int("max_steps_in_flight", {.min = 1, .max = 2, .expected = "1 or 2"},
        &s->max_steps_in_flight);
  r.OneOf("spin_wait", {"auto", "on", "off"}, &s->spin_wait);
  r.Int("copy_threads", {.min = 0, .max = 64, .expected = "an integer in 0..64 (0 = auto)"},
        &s->copy_threads);
  r.Bool("echo", &s->echo);
  r.Bool("allow_registered_memory", &s->allow_registered_memory);
  r.String(
      "metrics_listen", "host:port or \"\" (no metrics endpoint)",
      [](const std::string& v) { return v.empty() || IsHostPort(v); }, &s->metrics_listen);
  ObjectReader tls = r.Object("tls", "an object with cert, key and client_ca");
  tls.String("cert", "a PEM file path or \"\" (no TLS)", {}, &s->tls.cert);
  tls.String("key", "a PEM file path or \"\" (no TLS)", {}, &s->tls.key);
  tls.String("client_ca", "a PEM file path or \"\" (no client certificates)", {},
             &s->tls.client_ca);
  tls.Finish();
  ObjectReader rank_tls = r.Object("rank_tls", "an object with cert, key and ca");
  rank_tls.String("cert", "a PEM file path or \"\" (plaintext rank port)", {}, &s->rank_tls.cert);
  rank_tls.String("key", "a PEM file path or \"\" (plaintext rank port)", {}, &s->rank_tls.key);
  rank_tls.String("ca", "a PEM file path or \"\" (plaintext rank port)", {}, &s->rank_tls.ca);
  rank_tls.Finish();
  ObjectReader auth = r.Object("auth", "an object with tokens_file");
  auth.String("tokens_file", "a file path or \"\" (no authentication)", {}, &s->auth.tokens_file);
  auth.Finish();
  r.String("rank_secret_file", "a file path or \"\" (gcmoe serve: one it creates)", {},
           &s->rank_secret_file);
  r.Finish();
}

void ReadLogging(ObjectReader r, LoggingConfig* l) {
  r.OneOf("level", {"trace", "debug", "info", "warn", "error"}, &l->level);
  r.OneOf("format", {"text", "json"}, &l->format);
  r.String("file", "a file path or \"\" (stderr)", {}, &l->file);
  r.Int("failure_interval_ms",
        {.min = 100, .max = 3600000, .expected = "an integer in 100..3600000 (milliseconds)"},
        &l->failure_interval_ms);
  r.Int("failures_per_interval",
        {.min = 0, .max = 100000, .expected = "an integer in 0..100000 (0 = summaries only)"},
        &l->failures_per_interval);
  r.Finish();
}

}  // namespace

bool IsHostPort(const std::string& text) {
  for (const char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) return false;
  }
  std::string host;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close == 1 || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      return false;
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) return false;
    host = text.substr(0, colon);
    // An IPv6 address needs brackets, or its last group would read as the port.
    if (host.find(':') != std::string::npos) return false;
    port = text.substr(colon + 1);
  }
  return !host.empty() && AllDigits(port) && port.size() <= 5 && std::stoi(port) <= 65535;
}

bool IsWeightsSpec(const std::string& text) {
  const std::string prefix = "synthetic:";
  if (text.rfind(prefix, 0) == 0) {
    const std::string seed = text.substr(prefix.size());
    // A 64-bit seed has at most 20 digits.
    return AllDigits(seed) && seed.size() <= 19;
  }
  if (text.rfind("hf:", 0) == 0) return text.size() > 3;
  return !text.empty();
}

bool ParseTopology(const std::string& text, int* a, int* b) {
  if (text == "ring" || text == "cube") return true;
  const std::string prefix = "torus:";
  if (text.rfind(prefix, 0) != 0) return false;
  const std::string dims = text.substr(prefix.size());
  const size_t x = dims.find('x');
  if (x == std::string::npos) return false;
  const std::string sa = dims.substr(0, x);
  const std::string sb = dims.substr(x + 1);
  if (!AllDigits(sa) || !AllDigits(sb) || sa.size() > 4 || sb.size() > 4) return false;
  const int va = std::stoi(sa);
  const int vb = std::stoi(sb);
  if (va < 1 || vb < 1) return false;
  if (a != nullptr) *a = va;
  if (b != nullptr) *b = vb;
  return true;
}

Config ReadConfig(const json& document, Problems* problems, const CheckpointReader& checkpoint) {
  Config config;
  KeyIndex keys;
  if (!document.is_object()) {
    problems->Expected("(top level)",
                       "an object with sections model, parallel, engine, balancer, server and "
                       "logging",
                       Describe(document));
    return config;
  }
  ObjectReader root(&document, "", &keys, problems);
  ReadModel(root.Object("model",
                        "an object with hidden, intermediate, experts, top_k, layers and weights",
                        /*required=*/true),
            &config.model, checkpoint);
  ReadParallel(root.Object("parallel", "an object"), &config.parallel);
  ReadEngine(root.Object("engine", "an object"), &config.engine);
  ReadBalancer(root.Object("balancer", "an object"), &config.balancer);
  ReadServer(root.Object("server", "an object"), &config.server);
  ReadLogging(root.Object("logging", "an object"), &config.logging);
  root.Finish();
  keys.ReportUnknown(problems);
  return config;
}

}  // namespace gcmoe::config::internal
