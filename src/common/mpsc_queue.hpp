// mpsc_queue.hpp — a wait-free multi-producer, single-consumer intrusive queue (a stub node
// and an exchange on the tail, in the style of Vyukov's intrusive MPSC queue).
//
// Contract
//  - Node is any default-constructible type with a member `std::atomic<Node*> next`. The queue
//    links nodes through it and never allocates, copies or frees a node: a pushed node belongs
//    to the queue until pop() returns it. One default-constructed Node is the queue's stub.
//  - push() by any thread, wait-free (one exchange, one store).
//  - pop() by one thread at a time (the caller serializes: in ferry the lock holder or the
//    offload thread). It returns nullptr when the queue is empty, and may also return nullptr
//    while a push is between its two steps; that element shows up on a later pop — never
//    lost, never reordered per producer.
//  - empty_approx() is for the consumer only; a concurrent push may make it stale at once.
//  - The queue must be empty (or its nodes abandoned) when it is destroyed.
//
// Memory orders
//  - The tail exchange is acq_rel: release orders the pushed node's contents (and its reset
//    link) before the node becomes reachable; acquire orders this push after the previous
//    pusher's, whose node it links to.
//  - The link (prev->next) is stored release and every load of a link is acquire: whoever
//    follows the link sees the node as its producer wrote it.
//  - The node's own link is reset relaxed before the exchange: the exchange's release
//    publishes it.
#pragma once

#include <atomic>
#include <type_traits>

namespace ferry::detail {

template <class Node>
class MpscQueue {
  static_assert(std::is_same_v<decltype(Node::next), std::atomic<Node*>>, "Node needs std::atomic<Node*> next");

 public:
  MpscQueue() : head_(&stub_), tail_(&stub_) {}
  MpscQueue(const MpscQueue&) = delete;
  MpscQueue& operator=(const MpscQueue&) = delete;

  void push(Node* n) noexcept {
    n->next.store(nullptr, std::memory_order_relaxed);
    Node* prev = tail_.exchange(n, std::memory_order_acq_rel);
    prev->next.store(n, std::memory_order_release);
  }

  Node* pop() noexcept {
    Node* head = head_;
    Node* next = head->next.load(std::memory_order_acquire);
    if (head == &stub_) {  // skip the stub
      if (next == nullptr) return nullptr;
      head_ = next;
      head = next;
      next = next->next.load(std::memory_order_acquire);
    }
    if (next != nullptr) {
      head_ = next;
      return head;
    }
    // head is the last linked node: hand it out only once it is also the tail, after putting
    // the stub behind it so the queue never runs out of nodes.
    if (head != tail_.load(std::memory_order_acquire)) return nullptr;  // a push is half done
    push(&stub_);
    next = head->next.load(std::memory_order_acquire);
    if (next != nullptr) {
      head_ = next;
      return head;
    }
    return nullptr;  // another push got between: head comes out on a later pop
  }

  bool empty_approx() const noexcept {
    return head_ == &stub_ && stub_.next.load(std::memory_order_acquire) == nullptr;
  }

 private:
  Node* head_;  // consumer only
  std::atomic<Node*> tail_;
  Node stub_;
};

}  // namespace ferry::detail
