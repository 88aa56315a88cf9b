#include "common/rpc/tls_key_pair.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/str_cat.h"

namespace e3 {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

}  // namespace

absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem, const std::string& cert_path,
                                        const std::string& key_pem, const std::string& key_path) {
  auto cert_bio = MemoryBio(cert_pem);
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--tls_cert=", cert_path, ": not a PEM certificate"));
  }
  auto key_bio = MemoryBio(key_pem);
  // No passphrase callback: an encrypted key fails here rather than prompt.
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  if (key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key=", key_path, ": not an unencrypted PEM private key"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--tls_key=", key_path, " is not the key of the certificate in --tls_cert=",
                                                   cert_path, " (their public keys differ)"));
  }
  return absl::OkStatus();
}

}  // namespace e3
