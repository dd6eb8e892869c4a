// TLS for the coordinator's two ports and the rank's dial, from PEM files named in the config.
//
// Server certificates reload without a restart: gRPC's file-watching certificate provider reads
// private in-memory copies (memfd, named /proc/self/fd/N) that Reload() replaces atomically with
// dup2 once the new files have been read and checked. So an operator's edit takes effect on
// SIGHUP, never half-written, and a bad file is refused while the old certificate keeps serving.
// gRPC sees the new copy within kCertificateRefreshSeconds; connections made before keep theirs.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "common/status.h"
#include "config/config.h"

namespace gcmoe::server {

inline constexpr unsigned kCertificateRefreshSeconds = 1;

// The PEM files of one TLS endpoint and the config keys that name them (for messages).
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string ca;  // "" = no client certificates asked for
  std::string cert_key = "server.tls.cert";
  std::string key_key = "server.tls.key";
  std::string ca_key = "server.tls.client_ca";
};

TlsFiles PublicTlsFiles(const config::ServerConfig& server);
TlsFiles RankTlsFiles(const config::ServerConfig& server);

class ReloadableServerCredentials {
 public:
  // Reads and checks the files (the key matches the certificate, the CA parses): an error
  // names the config key and the file.
  static Result<std::unique_ptr<ReloadableServerCredentials>> Create(const TlsFiles& files);
  ~ReloadableServerCredentials();

  // With a CA, clients must present a certificate it signed (mTLS).
  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }
  // Reads the files again and swaps them in; on an error the current ones stay.
  Status Reload();

 private:
  ReloadableServerCredentials() = default;

  TlsFiles files_;
  std::mutex mu_;
  int cert_fd_ = -1;
  int key_fd_ = -1;
  int ca_fd_ = -1;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
};

// A rank's credentials to dial the coordinator (server.rank_tls): verifies the coordinator
// against the CA and presents the rank's certificate. Insecure when server.rank_tls is unset.
Result<std::shared_ptr<grpc::ChannelCredentials>> RankChannelCredentials(
    const config::ServerConfig& server);

}  // namespace gcmoe::server
