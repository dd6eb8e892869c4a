// A throwaway PKI for the TLS tests, made with openssl in the test's temp directory when the test
// runs (no key is checked in): a CA, a server certificate for 127.0.0.1 and localhost signed by
// it, a client certificate for mTLS, and a tokens file holding one bearer token.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

namespace gcmoe::server::testing {

struct TestPki {
  std::string dir;
  std::string ca_cert;  // PEM files
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
  std::string tokens_file;  // holds `token`
  std::string token;

  // `gcmoe serve` overrides: TLS with the server certificate, the tokens file, and client
  // certificates signed by the CA required when `mtls`.
  std::vector<std::string> ServeArgs(bool mtls) const;
  // Channel credentials that trust the CA; they present the client certificate when asked.
  std::shared_ptr<grpc::ChannelCredentials> Credentials(bool client_cert = true) const;
};

// nullopt, with a test failure naming the openssl command, when a step fails.
std::optional<TestPki> MakeTestPki(const std::string& name);

}  // namespace gcmoe::server::testing
