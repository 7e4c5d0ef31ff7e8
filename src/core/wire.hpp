// wire.hpp — the bytes ferry puts in front of every packet it sends.
//
// Every eager packet starts with a 16-byte WireHeader; a fragment adds a FragBody. Rendezvous control packets (RTS) carry
// an RtsBody after it; an iovec RTS carries the eager part and one RtsPart per zero-copy part.
// An atomic's request carries an AtomicBody, its answer an AtomicReply (core/atomic_wire.hpp).
// Encoding is memcpy of a trivially copyable struct: all ranks of a job run the same binary
// on the same architecture, so no byte swapping is done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ferry::detail {

enum class MsgKind : std::uint8_t {
  am = 1,         // eager active message: payload follows
  msg = 2,        // eager tagged send: payload follows
  rts_am = 3,     // rendezvous active message: RtsBody follows
  rts_msg = 4,    // rendezvous tagged send: RtsBody follows
  rts_iovec = 5,  // iovec active message: RtsBody, eager bytes, RtsPart[aux]
  fin = 6,        // rendezvous done: FinBody follows
  barrier = 7,    // one step of Runtime::barrier: tag = (epoch parity << 8) | round
  frag = 8,       // one piece of an eager am/msg: reserved = its kind, aux = message id, FragBody
  atomic = 9,     // a remote atomic's request: reserved = its AtomicOp, target = its DataType, AtomicBody
  atomic_reply = 10,  // its answer: AtomicReply follows
};

struct WireHeader {
  MsgKind kind;
  std::uint8_t reserved;
  std::uint16_t target;  // am / rts_am / rts_iovec: remote target id
  std::int32_t src;      // sender's rank
  std::uint32_t tag;
  std::uint32_t aux;     // rts_iovec: number of zero-copy parts
};
static_assert(sizeof(WireHeader) == 16, "the header is part of the wire format");
static_assert(std::is_trivially_copyable_v<WireHeader>);

// Where the sender's data lives, for the receiver to read it.
struct RtsBody {
  std::uint64_t size;     // total bytes (rts_iovec: the eager part's size)
  std::uint64_t addr;     // provider address of the data (virtual or offset, per mr mode)
  std::uint64_t key;      // provider key of the sender's region
  std::uint64_t send_op;  // the sender's operation id, echoed in the FIN
};
static_assert(sizeof(RtsBody) == 32);

struct RtsPart {
  std::uint64_t size;
  std::uint64_t addr;
  std::uint64_t key;
};
static_assert(sizeof(RtsPart) == 24);
static_assert(sizeof(WireHeader) + sizeof(RtsBody) == 16 + 32, "min_length's table");

// Where a fragment's bytes go in its message. A fragmented message is an eager am or msg whose
// header and payload exceed the provider's inject size; its pieces are injected one by one
// and reassembled by the receiver, keyed by (sender, message id).
struct FragBody {
  std::uint32_t offset;  // of this piece's first byte in the message's payload
  std::uint32_t total;   // the message's payload bytes
};
static_assert(sizeof(FragBody) == 8);

struct FinBody {
  std::uint64_t send_op;
};
static_assert(sizeof(FinBody) == 8, "min_length's table");

template <class T>
inline void encode(void* at, const T& value) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  std::memcpy(at, &value, sizeof(T));
}

template <class T>
inline T decode(const void* at) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

inline bool valid_kind(std::uint8_t k) noexcept { return k >= 1 && k <= 10; }

// The fewest bytes a packet of kind `k` holds: its header and fixed body; for a byte that
// names no kind, more than any packet holds (packets hold at most 1 GiB, FERRY_PACKET_SIZE).
// So `length >= min_length(k)` checks the kind and the length with one load and one compare.
// An rts_iovec's variable part is checked where it is read (Rendezvous::start_recv).
inline std::size_t min_length(std::uint8_t k) noexcept {
  struct Table {
    std::uint32_t at[256];
    constexpr Table() : at{} {
      for (std::uint32_t& v : at) v = 0xffffffffu;
      at[1] = 16;       // am
      at[2] = 16;       // msg
      at[3] = 16 + 32;  // rts_am
      at[4] = 16 + 32;  // rts_msg
      at[5] = 16 + 32;  // rts_iovec
      at[6] = 16 + 8;   // fin
      at[7] = 16;       // barrier
      at[8] = 16;       // frag (its FragBody is checked by Fragments)
      at[9] = 16 + 40;  // atomic: AtomicBody
      at[10] = 16 + 24; // atomic_reply: AtomicReply
    }
  };
  static constexpr Table kMin;
  return kMin.at[k];
}

}  // namespace ferry::detail
