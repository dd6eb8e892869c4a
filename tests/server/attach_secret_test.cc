// The attach secret on its own: which files it accepts, proofs bound to the nonce and to the
// Hello's identity, and the segment instance every holder derives alike.
#include "server/attach_secret.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>

#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

namespace internal = gcmoe::internal::v1;

std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = TempPath(name);
  unlink(path.c_str());
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

internal::Hello SomeHello() {
  internal::Hello hello;
  hello.set_rank(1);
  hello.set_world_size(2);
  hello.set_pid(4242);
  hello.set_incarnation(77);
  hello.set_transport_name("/gcmoe-abc-r1");
  hello.set_config_digest("0123456789abcdef");
  return hello;
}

TEST(AttachSecretTest, LoadsAPrivateFileWithoutItsTrailingNewline) {
  const std::string path = WriteFile("ok.secret", "0123456789abcdef0123\n", 0600);
  auto secret = AttachSecret::Load(path);
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  // Same bytes, same proofs: the newline was not part of the key.
  const internal::Hello hello = SomeHello();
  EXPECT_EQ(secret->Proof("nonce", hello),
            AttachSecret::FromBytes("0123456789abcdef0123").Proof("nonce", hello));
  EXPECT_TRUE(AttachSecret::Load(WriteFile("ro.secret", "0123456789abcdef0123", 0400)).ok());
}

TEST(AttachSecretTest, RefusesFilesOthersCanReadShortSecretsAndNoFile) {
  auto readable = AttachSecret::Load(WriteFile("644.secret", "0123456789abcdef0123", 0644));
  ASSERT_FALSE(readable.ok());
  EXPECT_NE(readable.status().message().find("server.rank_secret_file"), std::string::npos);
  EXPECT_NE(readable.status().message().find("has mode 0644"), std::string::npos)
      << readable.status().message();
  auto group = AttachSecret::Load(WriteFile("640.secret", "0123456789abcdef0123", 0640));
  EXPECT_FALSE(group.ok());

  auto short_secret = AttachSecret::Load(WriteFile("short.secret", "tooshort\n", 0600));
  ASSERT_FALSE(short_secret.ok());
  EXPECT_NE(short_secret.status().message().find("holds 8 bytes, expected at least 16"),
            std::string::npos)
      << short_secret.status().message();

  auto missing = AttachSecret::Load(TempPath("no-such.secret"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto unset = AttachSecret::Load("");
  ASSERT_FALSE(unset.ok());
  EXPECT_NE(unset.status().message().find("server.rank_secret_file: not set"), std::string::npos);
}

TEST(AttachSecretTest, AProofHoldsOnlyForItsNonceItsHelloAndItsSecret) {
  const AttachSecret secret = AttachSecret::FromBytes("the service's own secret");
  const AttachSecret other = AttachSecret::FromBytes("some other secret bytes");
  internal::Hello hello = SomeHello();
  hello.set_attach_proof(secret.Proof("nonce-1", hello));
  EXPECT_EQ(hello.attach_proof().size(), 32u);
  EXPECT_TRUE(secret.Verify("nonce-1", hello));
  EXPECT_FALSE(secret.Verify("nonce-2", hello)) << "a proof replayed on another stream";
  EXPECT_FALSE(other.Verify("nonce-1", hello));

  // Each identity field is bound: a proof for rank 1 is no proof for rank 0, and so on.
  const std::vector<std::function<void(internal::Hello*)>> changes = {
      [](internal::Hello* h) { h->set_rank(0); },
      [](internal::Hello* h) { h->set_world_size(3); },
      [](internal::Hello* h) { h->set_pid(4243); },
      [](internal::Hello* h) { h->set_incarnation(78); },
      [](internal::Hello* h) { h->set_transport_name("/gcmoe-abc-r0"); },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    internal::Hello changed = hello;
    changes[i](&changed);
    EXPECT_FALSE(secret.Verify("nonce-1", changed)) << "change " << i;
  }
  internal::Hello truncated = hello;
  truncated.set_attach_proof(hello.attach_proof().substr(0, 31));
  EXPECT_FALSE(secret.Verify("nonce-1", truncated));
  truncated.clear_attach_proof();
  EXPECT_FALSE(secret.Verify("nonce-1", truncated));
}

TEST(AttachSecretTest, InstanceNamesAgreeAmongHoldersAndDifferOtherwise) {
  const AttachSecret a = AttachSecret::FromBytes("the service's own secret");
  const AttachSecret b = AttachSecret::FromBytes("the service's own secret");
  const AttachSecret c = AttachSecret::FromBytes("some other secret bytes");
  EXPECT_EQ(a.InstanceName("d1"), b.InstanceName("d1"));
  EXPECT_EQ(a.InstanceName("d1").size(), 12u);
  EXPECT_NE(a.InstanceName("d1"), a.InstanceName("d2"));
  EXPECT_NE(a.InstanceName("d1"), c.InstanceName("d1"));
}

TEST(AttachSecretTest, ServeSecretFileIsPrivateAndGoneWithItsOwner) {
  std::string path;
  std::string dir;
  {
    auto file = PrivateSecretFile::Create();
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    path = (*file)->path();
    dir = path.substr(0, path.rfind('/'));
    struct stat st {};
    ASSERT_EQ(stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_TRUE(AttachSecret::Load(path).ok());
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  EXPECT_NE(access(dir.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace gcmoe::server::testing
