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
//  - Any thread may call either, concurrently. Everything sits under one short spin lock per
//    device: the critical section walks one bucket (rarely all of them), allocates nothing and
//    makes no system call.
//
// Layout: thousands of messages and receives may wait at once (a parcel layer gives each
// parcel's follow-ups a tag of their own), so one list would make every match a long walk.
// Receives and messages with a tag sit in one of kBuckets lists chosen by the tag; a list
// keeps its entries in order, and every message or receive of one tag is in the same list,
// so the first match in the tag's list is the oldest one. any_tag receives have a list of
// their own. Sequence numbers (per engine, so wrap-around needs 2^64 entries) order entries
// of different lists:
//  - a message meets the older of the first matching receive in its tag's list and the first
//    matching any_tag receive;
//  - an any_tag receive takes the oldest of the first matches of every message list.
#pragma once

#include <array>
#include <cstddef>
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
  static constexpr std::size_t kBuckets = 256;

  struct RecvResult {
    Packet* message;  // the matched unexpected message, or null
    Packet* queued;   // the descriptor now waiting, or null
  };
  // make() returns a descriptor with recv.want set, or null when none is free; it runs
  // under the lock, so it must be short and non-blocking (a lock-free pool get).
  template <class Make>
  RecvResult add_recv(int rank, Tag tag, Make&& make) noexcept {
    std::lock_guard<SpinLock> guard(lock_);
    if (waiting_messages_ != 0) {
      Found f{};
      if (tag != any_tag) {
        f = find(messages_[bucket(tag)], [&](const Packet* p) { return matches_message(rank, tag, p); });
      } else {
        f = oldest_message(rank);
      }
      if (f.entry != nullptr) {
        unlink(*f.list, f);
        --waiting_messages_;
        return {f.entry, nullptr};
      }
    }
    Packet* r = make();
    if (r != nullptr) {
      r->match_seq = next_seq_++;
      append(tag != any_tag ? recvs_[bucket(tag)] : any_tag_recvs_, r);
    }
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
    auto wants = [&](const Packet* p) { return tags_match(p->recv.want.rank, p->recv.want.tag, from.rank, from.tag); };
    List& tagged = recvs_[bucket(from.tag)];
    Found f = find(tagged, wants);
    f.list = &tagged;
    if (any_tag_recvs_.head != nullptr) {
      Found w = find(any_tag_recvs_, wants);
      w.list = &any_tag_recvs_;
      if (w.entry != nullptr && (f.entry == nullptr || w.entry->match_seq < f.entry->match_seq)) f = w;
    }
    if (f.entry != nullptr) {
      unlink(*f.list, f);
      return f.entry;
    }
    message->match_seq = next_seq_++;
    append(messages_[bucket(from.tag)], message);
    ++waiting_messages_;
    return nullptr;
  }

  // Removes every posted receive that names `rank` (not any_source) and hands each to out(r)
  // after the lock is released: a peer failed, so they can never match.
  template <class F>
  void take_recvs_from(int rank, F&& out) {
    Packet* taken = nullptr;
    {
      std::lock_guard<SpinLock> guard(lock_);
      auto sweep = [&](List& l) {
        Packet* prev = nullptr;
        for (Packet* p = l.head; p != nullptr;) {
          Packet* next = p->next;
          if (p->recv.want.rank == rank) {
            unlink(l, Found{&l, prev, p});
            p->next = taken;
            taken = p;
          } else {
            prev = p;
          }
          p = next;
        }
      };
      for (List& l : recvs_) sweep(l);
      sweep(any_tag_recvs_);
    }
    // Reversed by the prepend; posting order is restored so completions come oldest first.
    Packet* ordered = nullptr;
    while (taken != nullptr) {
      Packet* next = taken->next;
      taken->next = ordered;
      ordered = taken;
      taken = next;
    }
    while (ordered != nullptr) {
      Packet* next = ordered->next;
      ordered->next = nullptr;
      out(ordered);
      ordered = next;
    }
  }

  // Empties every list (teardown): each receive into recv_out, each message into message_out.
  template <class R, class M>
  void drain(R&& recv_out, M&& message_out) noexcept {
    std::lock_guard<SpinLock> guard(lock_);
    for (List& l : recvs_) empty(l, recv_out);
    empty(any_tag_recvs_, recv_out);
    for (List& l : messages_) empty(l, message_out);
    waiting_messages_ = 0;
  }

 private:
  struct List {
    Packet* head = nullptr;
    Packet* tail = nullptr;
  };
  // A list entry and the one before it (for unlinking a singly linked list).
  struct Found {
    List* list;
    Packet* prev;
    Packet* entry;
  };

  static std::size_t bucket(Tag tag) noexcept { return static_cast<std::size_t>(tag) % kBuckets; }
  static bool matches_message(int rank, Tag tag, const Packet* p) noexcept {
    return tags_match(rank, tag, p->arrived.from.rank, p->arrived.from.tag);
  }

  static void append(List& l, Packet* p) noexcept {
    p->next = nullptr;
    if (l.tail != nullptr) l.tail->next = p; else l.head = p;
    l.tail = p;
  }
  template <class Pred>
  static Found find(List& l, Pred&& pred) noexcept {
    Packet* prev = nullptr;
    for (Packet* p = l.head; p != nullptr; prev = p, p = p->next) {
      if (pred(p)) return {&l, prev, p};
    }
    return {&l, nullptr, nullptr};
  }
  static void unlink(List& l, const Found& f) noexcept {
    if (f.prev != nullptr) f.prev->next = f.entry->next; else l.head = f.entry->next;
    if (l.tail == f.entry) l.tail = f.prev;
    f.entry->next = nullptr;
  }
  // An any_tag receive: the oldest message from `rank` (or anyone) in any list.
  Found oldest_message(int rank) noexcept {
    Found best{nullptr, nullptr, nullptr};
    for (List& l : messages_) {
      if (l.head == nullptr) continue;
      const Found f = find(l, [&](const Packet* p) { return matches_message(rank, any_tag, p); });
      if (f.entry != nullptr && (best.entry == nullptr || f.entry->match_seq < best.entry->match_seq)) best = f;
    }
    return best;
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
  std::size_t waiting_messages_ = 0;  // messages in messages_ (a receive skips the walk at 0)
  std::uint64_t next_seq_ = 0;        // the order of every entry queued here
  List any_tag_recvs_;
  std::array<List, kBuckets> recvs_;
  std::array<List, kBuckets> messages_;
};

}  // namespace ferry::detail
