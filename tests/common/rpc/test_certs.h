// Certificates made at test time with the openssl command line: a CA, a
// server certificate it signs for localhost and 127.0.0.1, a client
// certificate it signs, and a second CA that signed nothing here.
#ifndef E3_TESTS_COMMON_RPC_TEST_CERTS_H_
#define E3_TESTS_COMMON_RPC_TEST_CERTS_H_

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace e3::testing {

struct TestCerts {
  std::string dir;
  std::string ca, server_cert, server_key, client_cert, client_key, other_ca;
};

// Writes the files into `dir`; false when openssl failed (the test then
// fails saying so).
inline bool MakeTestCerts(const std::string& dir, TestCerts* out) {
  const std::string script = absl::StrCat(
      "set -e; cd '", dir, "'\n",
      "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out $1 2>/dev/null; }\n",
      "key ca.key; openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj /CN=e3-test-ca 2>/dev/null\n",
      "key other.key; openssl req -x509 -new -key other.key -out other_ca.pem -days 2 -subj /CN=e3-other-ca 2>/dev/null\n",
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > server.ext\n",
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n",
      "for who in server client; do\n",
      "  key $who.key\n",
      "  openssl req -new -key $who.key -out $who.csr -subj /CN=e3-$who 2>/dev/null\n",
      "  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 2 "
      "-extfile $who.ext 2>/dev/null\n",
      "done\n");
  const std::string path = dir + "/make_certs.sh";
  std::ofstream(path) << script;
  if (std::system(("bash " + path).c_str()) != 0) return false;
  out->dir = dir;
  out->ca = dir + "/ca.pem";
  out->other_ca = dir + "/other_ca.pem";
  out->server_cert = dir + "/server.pem";
  out->server_key = dir + "/server.key";
  out->client_cert = dir + "/client.pem";
  out->client_key = dir + "/client.key";
  return true;
}

}  // namespace e3::testing

#endif  // E3_TESTS_COMMON_RPC_TEST_CERTS_H_
