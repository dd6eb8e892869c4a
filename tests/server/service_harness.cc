#include "tests/server/service_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "config/config.h"
#include "engine/numerics.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/engine_config.h"

namespace gcmoe::server::testing {

std::string GcmoeBinary() { return GCMOE_BINARY; }

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "gcmoe_" + std::to_string(getpid()) + "_" + name;
}

std::unique_ptr<Process> Process::Start(const std::vector<std::string>& args,
                                        const std::string& log_path) {
  auto process = std::make_unique<Process>();
  process->log_path_ = log_path;
  std::vector<std::string> argv_storage = {GcmoeBinary()};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  process->pid_ = pid;
  return process;
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

void Process::Signal(int signo) const {
  if (pid_ > 0 && !reaped_) kill(pid_, signo);
}

std::optional<int> Process::Wait(milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      reaped_ = true;
      return status;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(milliseconds(10));
  }
}

bool Process::running() { return !reaped_ && !Wait(milliseconds(0)).has_value(); }

std::string Process::Log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<long> NumberAfter(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + prefix.size();
  size_t end = begin;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  if (end == begin) return std::nullopt;
  return std::stol(text.substr(begin, end - begin));
}

std::optional<std::vector<std::string>> WaitForFile(const std::string& path,
                                                    milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(line);
    }
    if (!lines.empty()) return lines;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return std::nullopt;
}

std::string HealthStatus(const std::string& address, const std::string& service,
                         std::shared_ptr<grpc::ChannelCredentials> credentials) {
  auto channel =
      grpc::CreateChannel(address, credentials ? credentials : grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + milliseconds(500));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return "SERVICE_UNKNOWN";
  if (!status.ok()) return "UNREACHABLE";
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

bool WaitForHealth(const std::string& address, const std::string& want, milliseconds timeout,
                   std::shared_ptr<grpc::ChannelCredentials> credentials) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (HealthStatus(address, "", credentials) == want) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

namespace {

std::shared_ptr<grpc::Channel> MoeChannel(const std::string& address,
                                          std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  return grpc::CreateCustomChannel(
      address, credentials ? credentials : grpc::InsecureChannelCredentials(), args);
}

}  // namespace

std::unique_ptr<gcmoe::v1::MoeService::Stub> Connect(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return gcmoe::v1::MoeService::NewStub(MoeChannel(address, credentials));
}

std::unique_ptr<gcmoe::v1::MoeService::Stub> ConnectNow(const std::string& address) {
  std::shared_ptr<grpc::Channel> channel = MoeChannel(address, nullptr);
  channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return gcmoe::v1::MoeService::NewStub(channel);
}

void ForwardInOrder(const std::string& address, int n, const gcmoe::v1::ForwardRequest* requests,
                    gcmoe::v1::ForwardResponse* responses, grpc::Status* statuses,
                    milliseconds spacing) {
  std::vector<std::unique_ptr<gcmoe::v1::MoeService::Stub>> stubs;
  for (int i = 0; i < n; ++i) stubs.push_back(ConnectNow(address));
  std::vector<std::thread> callers;
  for (int i = 0; i < n; ++i) {
    callers.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      statuses[i] = stubs[i]->Forward(&context, requests[i], &responses[i]);
    });
    std::this_thread::sleep_for(spacing);
  }
  for (std::thread& t : callers) t.join();
}

grpc::Status Unregister(const std::string& address, const std::string& name,
                        const std::string& token) {
  auto stub = Connect(address);
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  gcmoe::v1::UnregisterMemoryRequest request;
  request.set_name(name);
  gcmoe::v1::UnregisterMemoryResponse response;
  return stub->UnregisterMemory(&context, request, &response);
}

std::optional<Service> StartServe(const std::vector<std::string>& extra_args,
                                  const std::string& name, milliseconds timeout,
                                  std::shared_ptr<grpc::ChannelCredentials> credentials) {
  Service service;
  service.log_path = TempPath(name + ".log");
  const std::string address_file = TempPath(name + ".address");
  // A test process whose pid an earlier run had finds that run's files here: its address file
  // would name a port nobody serves, its log another service's lines.
  std::remove(service.log_path.c_str());
  std::remove(address_file.c_str());
  // Port 0 everywhere: tests run in parallel, and the default metrics port is one fixed port.
  std::vector<std::string> args = {"serve", "--listen", "127.0.0.1:0", "--address-file",
                                   address_file, "--set", "server.rank_listen=127.0.0.1:0",
                                   "--set", "server.metrics_listen=127.0.0.1:0"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  service.process = Process::Start(args, service.log_path);
  auto lines = WaitForFile(address_file, timeout);
  if (!lines) {
    ADD_FAILURE() << "gcmoe serve (" << name << ") did not start serving; its log:\n"
                  << service.process->Log();
    return std::nullopt;
  }
  service.address = (*lines)[0];
  // The address file says the coordinator is listening; the callers want it answering.
  if (!WaitForHealth(service.address, "SERVING", timeout, credentials)) {
    ADD_FAILURE() << "gcmoe serve (" << name << ") at " << service.address
                  << " wrote its address but is not SERVING ("
                  << HealthStatus(service.address, "", credentials) << "); its log:\n"
                  << service.process->Log();
    return std::nullopt;
  }
  return service;
}

std::string WriteSecretFile(const std::string& name) {
  const std::string path = TempPath(name + ".secret");
  unlink(path.c_str());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  std::random_device random;
  std::string text;
  for (int i = 0; i < 32; ++i) text += "0123456789abcdef"[random() % 16];
  text += "\n";
  const bool written =
      fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (fd >= 0) close(fd);
  if (!written) ADD_FAILURE() << "cannot write the attach secret " << path;
  return path;
}

SeparateProcesses::SeparateProcesses(const std::string& name, std::vector<std::string> extra,
                                     int ranks)
    : name_(name), extra_(std::move(extra)), ranks_(ranks) {
  secret_file_ = WriteSecretFile(name);
  extra_.push_back("--set");
  extra_.push_back("server.rank_secret_file=" + secret_file_);
  const std::string address_file = TempPath(name + ".coordinator.address");
  // An earlier run's files, as in StartServe.
  std::remove(address_file.c_str());
  std::remove(TempPath(name + ".coordinator.log").c_str());
  for (int r = 0; r < ranks; ++r) {
    std::remove(TempPath(name + ".rank" + std::to_string(r) + ".log").c_str());
  }
  std::vector<std::string> args = {"coordinator",  "--listen",       "127.0.0.1:0",
                                   "--rank-listen", "127.0.0.1:0",   "--address-file",
                                   address_file,    "--set",          "server.metrics_listen=127.0.0.1:0"};
  args.insert(args.end(), extra_.begin(), extra_.end());
  coordinator_ = Process::Start(args, TempPath(name + ".coordinator.log"));
  auto lines = WaitForFile(address_file, milliseconds(20000));
  if (!lines || lines->size() < 2) {
    ADD_FAILURE() << "coordinator did not start:\n" << coordinator_->Log();
    return;
  }
  address_ = (*lines)[0];
  rank_address_ = (*lines)[1];
  if (lines->size() >= 3) metrics_address_ = (*lines)[2];
  for (int r = 0; r < ranks; ++r) StartRank(r);
}

void SeparateProcesses::StartRank(int r) {
  std::vector<std::string> args = {"rank", "--rank", std::to_string(r), "--coordinator",
                                   rank_address_};
  args.insert(args.end(), extra_.begin(), extra_.end());
  ranks_[r] = Process::Start(args, TempPath(name_ + ".rank" + std::to_string(r) + ".log"));
}

std::string SeparateProcesses::Logs() {
  std::string logs = "coordinator:\n" + coordinator_->Log();
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r]) logs += "\nrank " + std::to_string(r) + ":\n" + ranks_[r]->Log();
  }
  return logs;
}

std::vector<gcmoe::v1::ForwardRequest> DataPathRequests(uint64_t seed,
                                                        const std::string& id_prefix) {
  std::vector<gcmoe::v1::ForwardRequest> requests;
  const gcmoe::v1::DType dtypes[] = {gcmoe::v1::FP32, gcmoe::v1::BF16, gcmoe::v1::FP8_E4M3};
  int i = 0;
  for (int tokens : {1, 3, 8, 13, 29}) {
    for (gcmoe::v1::DType dtype : dtypes) {
      RequestSpec r;
      r.num_tokens = tokens;
      r.layer = i % 2;
      r.dtype = dtype;
      r.output_dtype = i % 3 == 0 ? gcmoe::v1::FP32 : gcmoe::v1::BF16;
      r.unused_every = i % 4 == 0 ? 3 : 0;
      r.seed = seed + i;
      gcmoe::v1::ForwardRequest request = MakeForwardRequest(DefaultModel(), r);
      request.set_request_id(id_prefix + std::to_string(i));
      requests.push_back(std::move(request));
      ++i;
    }
  }
  return requests;
}

std::vector<std::string> TwoRanksWith(const std::vector<std::string>& more) {
  std::vector<std::string> args = {"--ranks", "2", "--set", "engine.threads=1"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

engine::ModelSpec DefaultModel() { return ModelSpecFromConfig(config::DefaultConfig()); }

gcmoe::v1::ForwardRequest MakeForwardRequest(const engine::ModelSpec& spec, const RequestSpec& r) {
  const int H = spec.hidden;
  const int k = spec.top_k;
  const int E = spec.num_experts;
  const int T = r.num_tokens;
  std::mt19937_64 rng(r.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  std::vector<float> hidden(static_cast<size_t>(T) * H);
  for (float& v : hidden) v = normal(rng);
  std::vector<int32_t> ids(static_cast<size_t>(T) * k);
  std::vector<float> weights(static_cast<size_t>(T) * k);
  std::vector<int> experts(E);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) experts[e] = e;
    std::shuffle(experts.begin(), experts.end(), rng);
    if (r.hot_expert >= 0) {
      std::iter_swap(experts.begin(), std::find(experts.begin(), experts.end(), r.hot_expert));
    }
    for (int j = 0; j < k; ++j) {
      const bool unused = r.unused_every > 0 && (t * k + j) % r.unused_every == 1;
      ids[t * k + j] = unused ? -1 : experts[j];
      weights[t * k + j] = uniform(rng);
    }
  }
  gcmoe::v1::ForwardRequest request;
  request.set_layer(r.layer);
  request.set_output_dtype(r.output_dtype);
  request.set_request_id("test-" + std::to_string(r.seed));
  gcmoe::v1::Tensor* h = request.mutable_hidden();
  h->set_dtype(r.dtype);
  h->add_shape(T);
  h->add_shape(H);
  if (r.dtype == gcmoe::v1::FP32) {
    h->set_data(hidden.data(), hidden.size() * 4);
  } else if (r.dtype == gcmoe::v1::BF16) {
    std::vector<uint16_t> bits(hidden.size());
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = numerics::FloatToBF16(hidden[i]);
    h->set_data(bits.data(), bits.size() * 2);
  } else {
    std::vector<uint8_t> q(hidden.size());
    std::vector<uint8_t> scales(hidden.size() / 32);
    for (int t = 0; t < T; ++t) {
      numerics::QuantizeE4M3K32(&hidden[static_cast<size_t>(t) * H], H,
                                &q[static_cast<size_t>(t) * H],
                                &scales[static_cast<size_t>(t) * (H / 32)]);
    }
    h->set_data(q.data(), q.size());
    gcmoe::v1::Tensor* s = request.mutable_hidden_scales();
    s->set_dtype(gcmoe::v1::UE8M0);
    s->add_shape(T);
    s->add_shape(H / 32);
    s->set_data(scales.data(), scales.size());
  }
  gcmoe::v1::Tensor* id = request.mutable_topk_ids();
  id->set_dtype(gcmoe::v1::INT32);
  id->add_shape(T);
  id->add_shape(k);
  id->set_data(ids.data(), ids.size() * 4);
  gcmoe::v1::Tensor* w = request.mutable_topk_weights();
  w->set_dtype(gcmoe::v1::FP32);
  w->add_shape(T);
  w->add_shape(k);
  w->set_data(weights.data(), weights.size() * 4);
  return request;
}

std::vector<float> HiddenAsFloats(const gcmoe::v1::ForwardRequest& request) {
  const std::string& data = request.hidden().data();
  std::vector<float> out;
  if (request.hidden().dtype() == gcmoe::v1::FP32) {
    out.resize(data.size() / 4);
    std::memcpy(out.data(), data.data(), data.size());
  } else if (request.hidden().dtype() == gcmoe::v1::BF16) {
    out.resize(data.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t v;
      std::memcpy(&v, data.data() + 2 * i, 2);
      out[i] = numerics::BF16ToFloat(v);
    }
  } else {
    const int H = static_cast<int>(request.hidden().shape(1));
    out.resize(data.size());
    const auto* q = reinterpret_cast<const uint8_t*>(data.data());
    const auto* s = reinterpret_cast<const uint8_t*>(request.hidden_scales().data().data());
    for (size_t t = 0; t < out.size() / H; ++t) {
      numerics::DequantizeE4M3K32(q + t * H, s + t * (H / 32), H, &out[t * H]);
    }
  }
  return out;
}

std::vector<double> OutputAsDoubles(const gcmoe::v1::ForwardResponse& response) {
  const std::string& data = response.output().data();
  std::vector<double> out;
  if (response.output().dtype() == gcmoe::v1::FP32) {
    out.resize(data.size() / 4);
    for (size_t i = 0; i < out.size(); ++i) {
      float v;
      std::memcpy(&v, data.data() + 4 * i, 4);
      out[i] = v;
    }
  } else {
    out.resize(data.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t v;
      std::memcpy(&v, data.data() + 2 * i, 2);
      out[i] = numerics::BF16ToFloat(v);
    }
  }
  return out;
}

}  // namespace gcmoe::server::testing
