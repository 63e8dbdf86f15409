// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104): fingerprints of parameters, and the proof a
// store client gives that it knows the job's secret without sending it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace chorus {

std::array<uint8_t, 32> sha256(const void* data, size_t n);
// As lowercase hex (64 characters).
std::string sha256_hex(const void* data, size_t n);
// HMAC-SHA-256 of `message` under `key`, as lowercase hex.
std::string hmac_sha256_hex(std::string_view key, std::string_view message);

}  // namespace chorus
