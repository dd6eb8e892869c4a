#include "tests/server/test_pki.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `openssl args` in `dir`; false (with a test failure and openssl's words) when it fails.
bool OpenSsl(const std::string& dir, const std::string& args) {
  const std::string log = dir + "/openssl.log";
  const std::string command = "cd " + dir + " && openssl " + args + " > " + log + " 2>&1";
  const int rc = std::system(command.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 0) return true;
  ADD_FAILURE() << "failed: " << command << "\n" << ReadAll(log);
  return false;
}

constexpr const char* kNewKey = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

// A key and a certificate for 127.0.0.1 and localhost with the given extended key usage,
// signed by the CA in `dir`.
bool SignedCertificate(const std::string& dir, const std::string& name, const std::string& usage) {
  std::ofstream(dir + "/" + name + ".ext")
      << "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=" << usage << "\n";
  return OpenSsl(dir, std::string("req ") + kNewKey + " -keyout " + name + ".key -out " + name +
                          ".csr -subj /CN=" + name) &&
         OpenSsl(dir, "x509 -req -in " + name + ".csr -CA ca.crt -CAkey ca.key -CAcreateserial" +
                          " -days 2 -out " + name + ".crt -extfile " + name + ".ext");
}

}  // namespace

std::optional<TestPki> MakeTestPki(const std::string& name) {
  TestPki pki;
  pki.dir = TempPath(name + "_pki");
  if (std::system(("rm -rf " + pki.dir + " && mkdir -p " + pki.dir).c_str()) != 0) {
    ADD_FAILURE() << "cannot make " << pki.dir;
    return std::nullopt;
  }
  const bool made =
      OpenSsl(pki.dir, std::string("req -x509 ") + kNewKey +
                           " -keyout ca.key -out ca.crt -days 2 -subj /CN=gcmoe-test-ca"
                           " -addext basicConstraints=critical,CA:TRUE"
                           " -addext keyUsage=critical,keyCertSign,cRLSign") &&
      SignedCertificate(pki.dir, "server", "serverAuth") &&
      SignedCertificate(pki.dir, "client", "clientAuth");
  if (!made) return std::nullopt;
  pki.ca_cert = pki.dir + "/ca.crt";
  pki.server_cert = pki.dir + "/server.crt";
  pki.server_key = pki.dir + "/server.key";
  pki.client_cert = pki.dir + "/client.crt";
  pki.client_key = pki.dir + "/client.key";
  pki.token = "gcmoe-test-token-" + name;
  pki.tokens_file = pki.dir + "/tokens";
  std::ofstream(pki.tokens_file) << "# the test's one token\n" << pki.token << "\n";
  return pki;
}

std::vector<std::string> TestPki::ServeArgs(bool mtls) const {
  std::vector<std::string> args = {"--set", "server.tls.cert=" + server_cert,
                                   "--set", "server.tls.key=" + server_key,
                                   "--set", "server.auth.tokens_file=" + tokens_file};
  if (mtls) args.insert(args.end(), {"--set", "server.tls.client_ca=" + ca_cert});
  return args;
}

std::shared_ptr<grpc::ChannelCredentials> TestPki::Credentials(bool client_cert) const {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadAll(ca_cert);
  if (client_cert) {
    options.pem_cert_chain = ReadAll(this->client_cert);
    options.pem_private_key = ReadAll(client_key);
  }
  return grpc::SslCredentials(options);
}

}  // namespace gcmoe::server::testing
