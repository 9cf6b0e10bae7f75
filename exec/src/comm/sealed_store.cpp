// A job's store sealed with its secret (issue #37): torch's TCPStore answers any client that reaches its
// port (get, set, and listKeys of every key), so the job's keys and values are sealed instead. Key names
// are HMACs of the name under the secret; values are encrypted and authenticated: a process without the
// secret can list opaque names and read ciphertext, and whatever it writes is refused at the first read
// with one line, as is a rank started with another secret.
//
// The primitive is HMAC (RFC 2104) over torch's own SHA-1 (c10::sha1), so the store needs no library
// beyond libtorch on any machine the project builds on (the GPU machine has no OpenSSL headers). HMAC-SHA1
// is a sound PRF and MAC. Values are sealed deterministically, as SIV (RFC 5297's construction): the
// 16-byte synthetic IV is the HMAC of the key and the value, the keystream the HMAC of the IV and a block
// counter, and opening recomputes the IV from the decrypted value. The same (key, value) always seals to
// the same bytes, which compareSet needs; nothing else is revealed but the equality of equal values.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <c10/util/hash.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "zeroplan/exec/rendezvous.h"

namespace zeroplan::exec {

namespace {

using Bytes = std::string;  // raw bytes

Bytes from_hex(const std::string& hex) {
  Bytes out(hex.size() / 2, '\0');
  auto nibble = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  return out;
}

std::string to_hex(const Bytes& b) {
  std::string out;
  out.reserve(b.size() * 2);
  for (unsigned char c : b) out += fmt::format("{:02x}", c);
  return out;
}

Bytes sha1(const Bytes& m) { return from_hex(c10::sha1(m).str()); }

// HMAC-SHA1 (RFC 2104): 20 bytes.
Bytes hmac(const Bytes& key, const Bytes& message) {
  constexpr std::size_t kBlock = 64;
  Bytes k = key.size() > kBlock ? sha1(key) : key;
  k.resize(kBlock, '\0');
  Bytes inner(kBlock, '\0'), outer(kBlock, '\0');
  for (std::size_t i = 0; i < kBlock; ++i) {
    inner[i] = static_cast<char>(k[i] ^ 0x36);
    outer[i] = static_cast<char>(k[i] ^ 0x5c);
  }
  return sha1(outer + sha1(inner + message));
}

constexpr std::size_t kIv = 16;
const Bytes kMagic = "zps1";  // sealed-value format 1

class SealedStore final : public c10d::Store {
 public:
  SealedStore(c10::intrusive_ptr<c10d::Store> inner, const std::string& secret)
      : inner_(std::move(inner)),
        name_key_(hmac(secret, "zeroplan store: names")),
        iv_key_(hmac(secret, "zeroplan store: iv")),
        stream_key_(hmac(secret, "zeroplan store: stream")) {}

  c10::intrusive_ptr<Store> clone() override {
    auto copy = c10::make_intrusive<SealedStore>(inner_->clone(), "");
    copy->name_key_ = name_key_;
    copy->iv_key_ = iv_key_;
    copy->stream_key_ = stream_key_;
    return copy;
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_->set(name(key), seal(key, value));
  }

  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    const auto now = inner_->compareSet(name(key), expected.empty() ? expected : seal(key, expected), seal(key, desired));
    return now.empty() ? now : open(key, now);
  }

  std::vector<uint8_t> get(const std::string& key) override { return open(key, inner_->get(name(key))); }

  // A counter sealed as its decimal text (what TCPStore's add keeps), updated by compare-and-set.
  int64_t add(const std::string& key, int64_t value) override {
    const std::string n = name(key);
    for (;;) {
      std::vector<uint8_t> old;
      int64_t current = 0;
      if (inner_->check({n})) {
        old = inner_->get(n);
        const auto text = open(key, old);
        current = std::stoll(std::string(text.begin(), text.end()));
      }
      const std::string next = std::to_string(current + value);
      const auto desired = seal(key, std::vector<uint8_t>(next.begin(), next.end()));
      if (inner_->compareSet(n, old, desired) == desired) return current + value;
    }
  }

  bool deleteKey(const std::string& key) override { return inner_->deleteKey(name(key)); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(names(keys)); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(names(keys)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    inner_->wait(names(keys), timeout);
  }
  const std::chrono::milliseconds& getTimeout() const noexcept override { return inner_->getTimeout(); }
  void setTimeout(const std::chrono::milliseconds& timeout) override { inner_->setTimeout(timeout); }

  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    const std::string n = name(key);
    for (;;) {
      std::vector<uint8_t> old, joined;
      if (inner_->check({n})) {
        old = inner_->get(n);
        joined = open(key, old);
      }
      joined.insert(joined.end(), value.begin(), value.end());
      const auto desired = seal(key, joined);
      if (inner_->compareSet(n, old, desired) == desired) return;
    }
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& k : keys) out.push_back(get(k));
    return out;
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    for (std::size_t i = 0; i < keys.size() && i < values.size(); ++i) set(keys[i], values[i]);
  }
  bool hasExtendedApi() const override { return true; }

 private:
  std::string name(const std::string& key) const { return "zp/" + to_hex(hmac(name_key_, key)); }
  std::vector<std::string> names(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(name(k));
    return out;
  }

  Bytes iv(const std::string& key, const Bytes& value) const {
    return hmac(iv_key_, key + '\0' + value).substr(0, kIv);
  }
  // value XOR the keystream of `iv` (HMAC of the IV and a 4-byte block counter).
  Bytes crypt(const Bytes& iv, const Bytes& value) const {
    Bytes out = value;
    for (std::size_t at = 0, block = 0; at < out.size(); ++block) {
      const Bytes counter{static_cast<char>(block >> 24), static_cast<char>(block >> 16), static_cast<char>(block >> 8),
                          static_cast<char>(block)};
      const Bytes pad = hmac(stream_key_, iv + counter);
      for (std::size_t i = 0; i < pad.size() && at < out.size(); ++i, ++at) out[at] = static_cast<char>(out[at] ^ pad[i]);
    }
    return out;
  }

  std::vector<uint8_t> seal(const std::string& key, const std::vector<uint8_t>& value) const {
    const Bytes plain(value.begin(), value.end());
    const Bytes v = iv(key, plain);
    const Bytes sealed = kMagic + v + crypt(v, plain);
    return {sealed.begin(), sealed.end()};
  }

  std::vector<uint8_t> open(const std::string& key, const std::vector<uint8_t>& sealed) const {
    const Bytes s(sealed.begin(), sealed.end());
    if (s.size() >= kMagic.size() + kIv && s.compare(0, kMagic.size(), kMagic) == 0) {
      const Bytes v = s.substr(kMagic.size(), kIv);
      const Bytes plain = crypt(v, s.substr(kMagic.size() + kIv));
      const Bytes want = iv(key, plain);
      unsigned char diff = 0;  // constant time
      for (std::size_t i = 0; i < kIv; ++i) diff |= static_cast<unsigned char>(want[i] ^ v[i]);
      if (diff == 0) return {plain.begin(), plain.end()};
    }
    throw RendezvousError(fmt::format(
        "the store's value of \"{}\" was not written by this job: another process wrote into the store, or a rank "
        "runs with another ZEROPLAN_JOB_SECRET",
        key));
  }

  c10::intrusive_ptr<c10d::Store> inner_;
  Bytes name_key_, iv_key_, stream_key_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> seal_store(c10::intrusive_ptr<c10d::Store> inner, const std::string& secret) {
  return c10::make_intrusive<SealedStore>(std::move(inner), secret);
}

std::string job_tag(const std::string& secret, const std::string& job_id) {
  return "zp-job/" + to_hex(hmac(hmac(secret, "zeroplan store: job"), job_id)).substr(0, 32);
}

std::string new_job_secret() {
  std::random_device entropy;
  std::string out;
  for (int i = 0; i < 4; ++i) out += fmt::format("{:08x}", static_cast<std::uint32_t>(entropy()));
  return out;
}

}  // namespace zeroplan::exec
