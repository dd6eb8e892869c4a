#include "server/tls_credentials.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

namespace gcmoe::server {
namespace {

Result<std::string> ReadPem(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(key + ": cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return InvalidArgument(key + ": error reading " + path);
  return text.str();
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& text) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

std::unique_ptr<X509, X509Deleter> FirstCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  return std::unique_ptr<X509, X509Deleter>(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// The three files, read and checked against each other.
struct Pems {
  std::string cert;
  std::string key;
  std::string ca;
};

Result<Pems> ReadAndCheck(const TlsFiles& files) {
  Pems pems;
  GCMOE_ASSIGN_OR_RETURN(pems.cert, ReadPem(files.cert_key, files.cert));
  GCMOE_ASSIGN_OR_RETURN(pems.key, ReadPem(files.key_key, files.key));
  auto cert = FirstCertificate(pems.cert);
  if (!cert) {
    return InvalidArgument(files.cert_key + ": " + files.cert +
                           " holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)");
  }
  auto key_bio = MemoryBio(pems.key);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (!key) {
    return InvalidArgument(files.key_key + ": " + files.key +
                           " holds no unencrypted PEM private key");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return InvalidArgument(files.key_key + ": the key in " + files.key +
                           " does not belong to the certificate in " + files.cert + " (" +
                           files.cert_key + ")");
  }
  if (!files.ca.empty()) {
    GCMOE_ASSIGN_OR_RETURN(pems.ca, ReadPem(files.ca_key, files.ca));
    if (!FirstCertificate(pems.ca)) {
      return InvalidArgument(files.ca_key + ": " + files.ca +
                             " holds no PEM certificate (expected a CA bundle)");
    }
  }
  return pems;
}

// An anonymous in-memory file holding `content`.
Result<int> MemoryFile(const char* name, const std::string& content) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return Internal(std::string("memfd_create: ") + std::strerror(errno));
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string error = std::strerror(errno);
      close(fd);
      return Internal("writing a certificate copy: " + error);
    }
    written += static_cast<size_t>(n);
  }
  return fd;
}

std::string FdPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

// Points `*fd` at a new memory file with `content`: in place (dup3) when it exists, so the path
// gRPC watches stays the same and switches from the old content to the new in one step.
Status Replace(const char* name, const std::string& content, int* fd) {
  GCMOE_ASSIGN_OR_RETURN(const int fresh, MemoryFile(name, content));
  if (*fd < 0) {
    *fd = fresh;
    return Status::Ok();
  }
  const int rc = dup3(fresh, *fd, O_CLOEXEC);
  const int error = errno;
  close(fresh);
  if (rc < 0) return Internal(std::string("dup3: ") + std::strerror(error));
  return Status::Ok();
}

}  // namespace

TlsFiles PublicTlsFiles(const config::ServerConfig& server) {
  TlsFiles files;
  files.cert = server.tls.cert;
  files.key = server.tls.key;
  files.ca = server.tls.client_ca;
  return files;
}

TlsFiles RankTlsFiles(const config::ServerConfig& server) {
  TlsFiles files;
  files.cert = server.rank_tls.cert;
  files.key = server.rank_tls.key;
  files.ca = server.rank_tls.ca;
  files.cert_key = "server.rank_tls.cert";
  files.key_key = "server.rank_tls.key";
  files.ca_key = "server.rank_tls.ca";
  return files;
}

Result<std::unique_ptr<ReloadableServerCredentials>> ReloadableServerCredentials::Create(
    const TlsFiles& files) {
  GCMOE_ASSIGN_OR_RETURN(Pems pems, ReadAndCheck(files));
  std::unique_ptr<ReloadableServerCredentials> creds(new ReloadableServerCredentials());
  creds->files_ = files;
  GCMOE_RETURN_IF_ERROR(Replace("gcmoe-tls-cert", pems.cert, &creds->cert_fd_));
  GCMOE_RETURN_IF_ERROR(Replace("gcmoe-tls-key", pems.key, &creds->key_fd_));
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (!files.ca.empty()) {
    GCMOE_RETURN_IF_ERROR(Replace("gcmoe-tls-ca", pems.ca, &creds->ca_fd_));
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        FdPath(creds->key_fd_), FdPath(creds->cert_fd_), FdPath(creds->ca_fd_),
        kCertificateRefreshSeconds);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        FdPath(creds->key_fd_), FdPath(creds->cert_fd_), kCertificateRefreshSeconds);
  }
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!files.ca.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  creds->credentials_ = grpc::experimental::TlsServerCredentials(options);
  return creds;
}

ReloadableServerCredentials::~ReloadableServerCredentials() {
  for (const int fd : {cert_fd_, key_fd_, ca_fd_}) {
    if (fd >= 0) close(fd);
  }
}

Status ReloadableServerCredentials::Reload() {
  GCMOE_ASSIGN_OR_RETURN(Pems pems, ReadAndCheck(files_));
  std::lock_guard<std::mutex> lock(mu_);
  // The swaps are microseconds apart: a refresh of gRPC's watcher that reads between them would
  // see the new key beside the old certificate; its next refresh, a period later, reads the
  // matched pair.
  GCMOE_RETURN_IF_ERROR(Replace("gcmoe-tls-key", pems.key, &key_fd_));
  GCMOE_RETURN_IF_ERROR(Replace("gcmoe-tls-cert", pems.cert, &cert_fd_));
  if (ca_fd_ >= 0) GCMOE_RETURN_IF_ERROR(Replace("gcmoe-tls-ca", pems.ca, &ca_fd_));
  return Status::Ok();
}

Result<std::shared_ptr<grpc::ChannelCredentials>> RankChannelCredentials(
    const config::ServerConfig& server) {
  const TlsFiles files = RankTlsFiles(server);
  if (files.cert.empty()) return grpc::InsecureChannelCredentials();
  GCMOE_ASSIGN_OR_RETURN(Pems pems, ReadAndCheck(files));
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pems.ca;
  options.pem_private_key = pems.key;
  options.pem_cert_chain = pems.cert;
  return grpc::SslCredentials(options);
}

}  // namespace gcmoe::server
