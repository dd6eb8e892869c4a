// The attach secret: what a rank proves it holds before the coordinator listens to it
// (server.rank_secret_file). Without it anyone who can reach server.rank_listen could attach as a
// rank, receive client activations and forge outputs.
//
// The secret never travels: the coordinator sends a fresh nonce per Attach stream and the rank
// answers with HMAC-SHA256(secret, nonce and the Hello's identity fields). A proof seen on the
// wire is worth nothing on another stream, and a rank that dials a squatter on the coordinator's
// port gives away no more than one such proof.
//
// The secret also names the service's shared-memory segments (InstanceName): ranks holding it
// agree on the names without being told, and the coordinator knows which names to expect.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "gcmoe/internal/v1/rank.pb.h"

namespace gcmoe::server {

class AttachSecret {
 public:
  // Reads the secret from `path` (the value of server.rank_secret_file). Refuses a file that is
  // not a regular file (a symbolic link included), that neither this user owns with no access
  // for group and others, nor root owns with read access for this user's group alone (a
  // Kubernetes Secret mounted for a non-root pod), or that holds fewer than kMinBytes bytes
  // (trailing whitespace aside): a secret others can read proves nothing.
  static Result<AttachSecret> Load(const std::string& path);
  // A secret held in memory (tests, and the file serve creates).
  static AttachSecret FromBytes(std::string bytes) { return AttachSecret(std::move(bytes)); }

  // The proof a rank sends in Hello.attach_proof for the coordinator's Challenge nonce.
  std::string Proof(const std::string& nonce, const gcmoe::internal::v1::Hello& hello) const;
  // Constant-time comparison of hello.attach_proof with the expected proof.
  bool Verify(const std::string& nonce, const gcmoe::internal::v1::Hello& hello) const;

  // The name that every rank of the service built from `config_digest` gives its exchange
  // segments ("/gcmoe-<instance>-r<rank>"): 12 hex digits derived from the secret and the digest.
  std::string InstanceName(const std::string& config_digest) const;

  static constexpr size_t kMinBytes = 16;

 private:
  explicit AttachSecret(std::string bytes) : bytes_(std::move(bytes)) {}
  std::string bytes_;
};

// 32 bytes from the system's cryptographic random source: a Challenge nonce, or a new secret.
Result<std::string> RandomBytes(size_t count);

// `gcmoe serve` without server.rank_secret_file: a new random secret in a file of a new private
// directory (mode 0700, the file 0600), removed with this object. Its path is handed to the
// ranks serve spawns as their server.rank_secret_file, so the secret is never on a command line.
class PrivateSecretFile {
 public:
  static Result<std::unique_ptr<PrivateSecretFile>> Create();
  ~PrivateSecretFile();
  PrivateSecretFile(const PrivateSecretFile&) = delete;
  PrivateSecretFile& operator=(const PrivateSecretFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  PrivateSecretFile(std::string dir, std::string path)
      : dir_(std::move(dir)), path_(std::move(path)) {}
  std::string dir_;
  std::string path_;
};

}  // namespace gcmoe::server
