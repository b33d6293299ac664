// Bounds-checked big-endian reading and writing of byte strings.
//
// ByteReader never reads past its end: every read returns an error naming the
// field and the byte offset instead. ByteWriter appends to a std::string.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "outbox_relay/core/result.h"

namespace outbox_relay {

class ByteReader {
 public:
  explicit ByteReader(std::string_view data) : data_(data) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }
  bool empty() const { return pos_ == data_.size(); }

  Result<uint8_t> U8(std::string_view field) {
    if (remaining() < 1) return Short(field, 1);
    return static_cast<uint8_t>(data_[pos_++]);
  }
  Result<uint16_t> U16(std::string_view field) { return ReadBE<uint16_t>(field); }
  Result<uint32_t> U32(std::string_view field) { return ReadBE<uint32_t>(field); }
  Result<uint64_t> U64(std::string_view field) { return ReadBE<uint64_t>(field); }
  Result<int16_t> I16(std::string_view field) { return Cast<int16_t>(ReadBE<uint16_t>(field)); }
  Result<int32_t> I32(std::string_view field) { return Cast<int32_t>(ReadBE<uint32_t>(field)); }
  Result<int64_t> I64(std::string_view field) { return Cast<int64_t>(ReadBE<uint64_t>(field)); }

  // Exactly `n` bytes, as a view into the underlying buffer.
  Result<std::string_view> Bytes(size_t n, std::string_view field) {
    if (remaining() < n) return Short(field, n);
    std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  // A NUL-terminated string (the terminator is consumed, not returned).
  Result<std::string_view> CString(std::string_view field) {
    const void* nul = std::memchr(data_.data() + pos_, '\0', remaining());
    if (nul == nullptr) {
      return Fail(ErrorCode::kProtocol, "{} at byte {}: missing NUL terminator", field, pos_);
    }
    size_t len = static_cast<const char*>(nul) - (data_.data() + pos_);
    std::string_view out = data_.substr(pos_, len);
    pos_ += len + 1;
    return out;
  }

  // The rest of the buffer.
  std::string_view Rest() {
    std::string_view out = data_.substr(pos_);
    pos_ = data_.size();
    return out;
  }

 private:
  [[gnu::cold, gnu::noinline]] std::unexpected<Error> Short(std::string_view field,
                                                            size_t need) const {
    return Fail(ErrorCode::kProtocol, "{} at byte {}: need {} bytes, {} left", field, pos_, need,
                remaining());
  }

  template <typename U>
  Result<U> ReadBE(std::string_view field) {
    if (remaining() < sizeof(U)) [[unlikely]]
      return Short(field, sizeof(U));
    U v;
    std::memcpy(&v, data_.data() + pos_, sizeof(U));
    pos_ += sizeof(U);
    if constexpr (std::endian::native == std::endian::little && sizeof(U) > 1) {
      v = std::byteswap(v);
    }
    return v;
  }

  template <typename S, typename U>
  static Result<S> Cast(Result<U> r) {
    if (!r) return std::unexpected(std::move(r.error()));
    return static_cast<S>(*r);
  }

  std::string_view data_;
  size_t pos_ = 0;
};

class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}

  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { WriteBE(v); }
  void U32(uint32_t v) { WriteBE(v); }
  void U64(uint64_t v) { WriteBE(v); }
  void I16(int16_t v) { WriteBE(static_cast<uint16_t>(v)); }
  void I32(int32_t v) { WriteBE(static_cast<uint32_t>(v)); }
  void I64(int64_t v) { WriteBE(static_cast<uint64_t>(v)); }
  void Bytes(std::string_view b) { out_->append(b); }
  void CString(std::string_view s) {
    out_->append(s);
    out_->push_back('\0');
  }

 private:
  template <typename U>
  void WriteBE(U v) {
    char buf[sizeof(U)];
    for (size_t i = 0; i < sizeof(U); ++i) {
      buf[i] = static_cast<char>((v >> (8 * (sizeof(U) - 1 - i))) & 0xff);
    }
    out_->append(buf, sizeof(U));
  }

  std::string* out_;
};

}  // namespace outbox_relay
