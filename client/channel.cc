#include "client/channel.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <grpcpp/support/client_interceptor.h>

namespace gcmoe::client {
namespace {

Result<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(flag + ": cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The token of a tokens file: its first line that is neither blank nor a '#' comment.
Result<std::string> ReadToken(const std::string& path) {
  GCMOE_ASSIGN_OR_RETURN(const std::string text, ReadFile("--token-file", path));
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos || line[begin] == '#') continue;
    const size_t end = line.find_last_not_of(" \t\r");
    return line.substr(begin, end - begin + 1);
  }
  return InvalidArgument("--token-file: " + path + " holds no token");
}

// True when addr ("host:port", "[v6]:port", "unix:PATH", with gRPC's "dns:///", "ipv4:" or
// "ipv6:" scheme) can only reach this machine: a loopback IP, localhost or a Unix socket.
bool IsLoopback(std::string addr) {
  for (const char* scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (addr.starts_with(scheme)) addr = addr.substr(std::strlen(scheme));
  }
  if (addr.starts_with("unix:") || addr.starts_with("unix-abstract:")) return true;
  std::string host = addr;  // "host:port" or "[v6]:port"
  if (host.starts_with("[")) {
    host = host.substr(1, host.find(']') - 1);
  } else if (host.find(':') == host.rfind(':')) {
    host = host.substr(0, host.find(':'));
  }
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// Adds the bearer token to every call's metadata. Per call, not as call credentials: gRPC
// sends call credentials only over TLS, and a plaintext service on loopback may use tokens too.
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class BearerInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::string token) : header_("Bearer " + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;  // outlives the channel's interceptors: the channel owns us
};

}  // namespace

void AddConnectionFlags(Flags* flags, ConnectionOptions* options) {
  flags->Bool("tls", &options->tls, "connect over TLS, verifying the server with the system CAs");
  flags->String("tls-ca", &options->tls_ca,
                "connect over TLS, verifying the server against this PEM CA bundle");
  flags->String("tls-cert", &options->tls_cert,
                "client certificate (PEM) for a server that asks for one (mTLS); with --tls-key");
  flags->String("tls-key", &options->tls_key, "private key (PEM) of --tls-cert");
  flags->String("tls-server-name", &options->tls_server_name,
                "the name to check the server's certificate against (default: the --addr host)");
  flags->String("token-file", &options->token_file,
                "send the token in this file as \"authorization: Bearer TOKEN\"");
}

Result<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& addr, int max_message_bytes,
                                                   const ConnectionOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return InvalidArgument("--tls-cert and --tls-key go together");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  const bool tls = options.tls || !options.tls_ca.empty() || !options.tls_cert.empty();
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca.empty()) {
      GCMOE_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile("--tls-ca", options.tls_ca));
    }
    if (!options.tls_cert.empty()) {
      GCMOE_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadFile("--tls-cert", options.tls_cert));
      GCMOE_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFile("--tls-key", options.tls_key));
    }
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  } else if (!options.tls_server_name.empty()) {
    return InvalidArgument("--tls-server-name needs TLS (--tls or --tls-ca)");
  }
  if (options.token_file.empty()) return grpc::CreateCustomChannel(addr, credentials, args);
  if (!tls && !IsLoopback(addr)) {
    return InvalidArgument("--token-file needs TLS (--tls or --tls-ca) to reach " + addr +
                           ": a token on a plaintext connection crosses the network in the "
                           "clear (only a loopback address may go without)");
  }
  GCMOE_ASSIGN_OR_RETURN(std::string token, ReadToken(options.token_file));
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<BearerInterceptorFactory>(std::move(token)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(addr, credentials, args,
                                                                 std::move(factories));
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& addr, int max_message_bytes,
                                           bool own_connection) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args);
}

std::string GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "CODE_" + std::to_string(static_cast<int>(code));
  }
}

bool IsUnreachable(grpc::Channel* channel, const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
      status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return false;
  }
  return channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
}

std::string DescribeFailure(const std::string& addr, const std::string& rpc, grpc::Channel* channel,
                            const grpc::Status& status) {
  if (IsUnreachable(channel, status)) {
    return "cannot reach " + addr + ": " + status.error_message();
  }
  return rpc + " on " + addr + " failed: " + GrpcCodeName(status.error_code()) + ": " +
         status.error_message();
}

}  // namespace gcmoe::client
