#include "server/attach_secret.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace gcmoe::server {
namespace {

constexpr char kField[] = "server.rank_secret_file";

std::string Hex(const unsigned char* bytes, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 15];
  }
  return out;
}

template <typename T>
void AppendFixed(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// HMAC-SHA256 of `message` under `key`, 32 bytes.
std::string Hmac(const std::string& key, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_bytes = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_bytes);
  return std::string(reinterpret_cast<const char*>(mac), mac_bytes);
}

// What a proof binds: the nonce and every field of the Hello that says who the rank is, each
// at a fixed width or length-prefixed so that no two Hellos encode alike.
std::string ProofMessage(const std::string& nonce, const gcmoe::internal::v1::Hello& hello) {
  std::string m = "gcmoe rank attach v1";
  AppendFixed<uint64_t>(&m, nonce.size());
  m += nonce;
  AppendFixed<uint32_t>(&m, hello.rank());
  AppendFixed<uint32_t>(&m, hello.world_size());
  AppendFixed<int64_t>(&m, hello.pid());
  AppendFixed<uint64_t>(&m, hello.incarnation());
  AppendFixed<uint64_t>(&m, hello.transport_name().size());
  m += hello.transport_name();
  return m;
}

std::string Quoted(const std::string& path) { return "\"" + path + "\""; }

}  // namespace

Result<AttachSecret> AttachSecret::Load(const std::string& path) {
  if (path.empty()) {
    return InvalidArgument(std::string(kField) +
                           ": not set; ranks and the coordinator must share an attach secret "
                           "(a file of at least 16 random bytes, mode 0600)");
  }
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return NotFound(std::string(kField) + ": cannot open " + Quoted(path) + ": " +
                    std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return InvalidArgument(std::string(kField) + ": " + Quoted(path) + " is not a regular file");
  }
  // Either this user's own file that nobody else may open, or one that root owns and shares
  // with this user's group only (how Kubernetes mounts a Secret for a non-root pod: owner root,
  // group fsGroup, mode defaultMode 0440).
  const bool own = st.st_uid == geteuid();
  const bool root_for_group = st.st_uid == 0 && st.st_gid == getegid();
  if (!own && !root_for_group) {
    close(fd);
    return InvalidArgument(std::string(kField) + ": " + Quoted(path) + " is owned by uid " +
                           std::to_string(st.st_uid) + ", expected this service's user (uid " +
                           std::to_string(geteuid()) + "), or root with this service's group (gid " +
                           std::to_string(getegid()) + ")");
  }
  const mode_t forbidden = own ? 077 : 027;  // root's file: group may read, nothing more
  if ((st.st_mode & forbidden) != 0) {
    close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return InvalidArgument(std::string(kField) + ": " + Quoted(path) + " has mode " + mode +
                           (own ? ", expected no access for group and others (chmod 600)"
                                : ", expected read access for the group alone (0440)"));
  }
  std::string bytes;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string error = std::strerror(errno);
      close(fd);
      return DataLoss(std::string(kField) + ": reading " + Quoted(path) + ": " + error);
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
    if (bytes.size() > (1 << 16)) {
      close(fd);
      return InvalidArgument(std::string(kField) + ": " + Quoted(path) +
                             " is over 64 KiB, expected a short secret");
    }
  }
  close(fd);
  // An editor's or echo's final newline is not part of the secret.
  while (!bytes.empty() && std::strchr(" \t\r\n", bytes.back()) != nullptr) bytes.pop_back();
  if (bytes.size() < kMinBytes) {
    return InvalidArgument(std::string(kField) + ": " + Quoted(path) + " holds " +
                           std::to_string(bytes.size()) + " bytes, expected at least " +
                           std::to_string(kMinBytes));
  }
  return AttachSecret(std::move(bytes));
}

std::string AttachSecret::Proof(const std::string& nonce,
                                const gcmoe::internal::v1::Hello& hello) const {
  return Hmac(bytes_, ProofMessage(nonce, hello));
}

bool AttachSecret::Verify(const std::string& nonce, const gcmoe::internal::v1::Hello& hello) const {
  const std::string expected = Proof(nonce, hello);
  const std::string& offered = hello.attach_proof();
  return offered.size() == expected.size() &&
         CRYPTO_memcmp(offered.data(), expected.data(), expected.size()) == 0;
}

std::string AttachSecret::InstanceName(const std::string& config_digest) const {
  const std::string mac = Hmac(bytes_, "gcmoe exchange instance v1|" + config_digest);
  return Hex(reinterpret_cast<const unsigned char*>(mac.data()), 6);
}

Result<std::string> RandomBytes(size_t count) {
  std::string bytes(count, '\0');
  size_t filled = 0;
  while (filled < count) {
    const ssize_t n = getrandom(bytes.data() + filled, count - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Unavailable(std::string("getrandom: ") + std::strerror(errno));
    filled += static_cast<size_t>(n);
  }
  return bytes;
}

Result<std::unique_ptr<PrivateSecretFile>> PrivateSecretFile::Create() {
  GCMOE_ASSIGN_OR_RETURN(const std::string secret, RandomBytes(32));
  char dir_template[] = "/tmp/gcmoe-serve-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return Unavailable(std::string("creating a private directory for the rank attach secret: ") +
                       std::strerror(errno));
  }
  const std::string dir = dir_template;  // mkdtemp creates it 0700
  const std::string path = dir + "/rank.secret";
  std::unique_ptr<PrivateSecretFile> file(new PrivateSecretFile(dir, path));
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Unavailable("creating " + path + ": " + std::strerror(errno));
  }
  const std::string text =
      Hex(reinterpret_cast<const unsigned char*>(secret.data()), secret.size()) + "\n";
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!written) return Unavailable("writing " + path + ": " + std::strerror(errno));
  return file;
}

PrivateSecretFile::~PrivateSecretFile() {
  unlink(path_.c_str());
  rmdir(dir_.c_str());
}

}  // namespace gcmoe::server
