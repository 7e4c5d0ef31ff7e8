// matching.hpp — pairs posted receives with arriving tagged messages (send/recv).
//
// Contract
//  - Entries are Packets: a posted receive is a packet whose `recv` view holds the receive's
//    descriptor (want: rank or any_source, tag or any_tag; buffer, size); an unexpected
//    message is the packet it arrived in, its sender and tag in its `arrived.from`. The
//    engine reads the `recv` view of its receives only, `arrived` of its messages only.
//  - add_recv(rank, tag, make) returns the oldest unexpected message the receive matches
//    (removing it); only when none matches does it call make() for a descriptor and queue it,
//    so a receive of a message that is already here needs no descriptor at all. (A receive
//    must never wait for a resource that only its own match would free.)
//    add_message(m) returns the oldest posted receive that matches m (removing it), or queues
//    m. So a receive gets messages in arrival order, and messages receives in posting order
//    (MPI's non-overtaking rule, per device).
//  - Any thread may call either, concurrently. Both lists sit under one short spin lock per
//    device: the critical section is a list walk with no allocation and no system call.
#pragma once

#include <cstdint>

#include "core/packet_pool.hpp"
#include "common/spinlock.hpp"
#include "ferry/completion.hpp"

namespace ferry::detail {

inline bool tags_match(int want_rank, Tag want_tag, int rank, Tag tag) noexcept {
  return (want_rank == any_source || want_rank == rank) && (want_tag == any_tag || want_tag == tag);
}

class MatchingEngine {
 public:
  struct RecvResult {
    Packet* message;  // the matched unexpected message, or null
    Packet* queued;   // the descriptor now waiting, or null
  };
  // make() returns a descriptor with recv.want set, or null when none is free; it runs
  // under the lock, so it must be short and non-blocking (a lock-free pool get).
  template <class Make>
  RecvResult add_recv(int rank, Tag tag, Make&& make) noexcept {
    std::lock_guard<SpinLock> guard(lock_);
    if (Packet* m = take(messages_, [&](const Packet* p) { return tags_match(rank, tag, p->arrived.from.rank, p->arrived.from.tag); })) {
      return {m, nullptr};
    }
    Packet* r = make();
    if (r != nullptr) append(recvs_, r);
    return {nullptr, r};
  }

  // The same with a ready descriptor (tests, and callers that already hold one).
  Packet* add_recv(Packet* recv) noexcept {
    const RecvResult res = add_recv(recv->recv.want.rank, recv->recv.want.tag, [recv] { return recv; });
    return res.message;
  }

  Packet* add_message(Packet* message) noexcept {
    std::lock_guard<SpinLock> guard(lock_);
    const MatchKey from = message->arrived.from;
    if (Packet* r = take(recvs_, [&](const Packet* p) { return tags_match(p->recv.want.rank, p->recv.want.tag, from.rank, from.tag); })) {
      return r;
    }
    append(messages_, message);
    return nullptr;
  }

  // Empties both lists (teardown): each receive into recv_out, each message into message_out.
  template <class R, class M>
  void drain(R&& recv_out, M&& message_out) noexcept {
    std::lock_guard<SpinLock> guard(lock_);
    empty(recvs_, recv_out);
    empty(messages_, message_out);
  }

 private:
  struct List {
    Packet* head = nullptr;
    Packet* tail = nullptr;
  };
  static void append(List& l, Packet* p) noexcept {
    p->next = nullptr;
    if (l.tail != nullptr) l.tail->next = p; else l.head = p;
    l.tail = p;
  }
  template <class Pred>
  static Packet* take(List& l, Pred&& pred) noexcept {
    Packet* prev = nullptr;
    for (Packet* p = l.head; p != nullptr; prev = p, p = p->next) {
      if (!pred(p)) continue;
      if (prev != nullptr) prev->next = p->next; else l.head = p->next;
      if (l.tail == p) l.tail = prev;
      p->next = nullptr;
      return p;
    }
    return nullptr;
  }

  template <class F>
  static void empty(List& l, F& out) noexcept {
    for (Packet* p = l.head; p != nullptr;) {
      Packet* next = p->next;
      out(p);
      p = next;
    }
    l = List{};
  }

  SpinLock lock_;
  List recvs_;
  List messages_;
};

}  // namespace ferry::detail
