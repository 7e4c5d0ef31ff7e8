// The UCX transport as the target of RMA over active messages (net/ucx/am_rma.hpp), fed by a
// raw UCP endpoint that sends what no ferry peer would: a request's header is bytes from the
// wire, checked against this rank's registrations (key, range, access) before any byte moves,
// and an answer that names no operation of this rank's is dropped. A valid put sent after the
// forged ones is the control: UCX delivers one endpoint's messages in order, so once its bytes
// are in place every forged request before it was handled.
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "net/transport.hpp"
#include "net/ucx/am_rma.hpp"
#include "net/ucx/ucp.hpp"

namespace {

using namespace ferry::net;
using namespace ferry::net::ucx;

std::vector<unsigned char> unhex(const std::string& s) {
  std::vector<unsigned char> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return out;
}

// A UCP worker of its own with an endpoint to the transport's worker.
class Forger {
 public:
  explicit Forger(const std::string& address) {
    ucp_config_t* config = nullptr;
    EXPECT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    EXPECT_EQ(ucp_init(&params, config, &context_), UCS_OK);
    ucp_config_release(config);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    EXPECT_EQ(ucp_worker_create(context_, &wp, &worker_), UCS_OK);
    const std::vector<unsigned char> bytes = unhex(address.substr(0, address.find('/')));  // the worker's part
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(bytes.data());
    EXPECT_EQ(ucp_ep_create(worker_, &ep, &ep_), UCS_OK);
  }
  ~Forger() {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(ep_, &p);
    while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }
  Forger(const Forger&) = delete;
  Forger& operator=(const Forger&) = delete;

  // Sends one eager active message and waits until UCX is done with its buffers.
  void send(unsigned id, const void* header, std::size_t header_length, const void* data, std::size_t length) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    void* r = ucp_am_send_nbx(ep_, id, header, header_length, data, length, &p);
    ASSERT_FALSE(UCS_PTR_IS_ERR(r)) << ucs_status_string(UCS_PTR_STATUS(r));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (r != nullptr && ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_);
    }
    if (r != nullptr) {
      ASSERT_NE(ucp_request_check_status(r), UCS_INPROGRESS) << "the forged message was never sent";
      ucp_request_free(r);
    }
  }
  void progress() { ucp_worker_progress(worker_); }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
};

PutHeader put_header(std::uint64_t addr, std::uint64_t key, std::uint64_t length, std::uint64_t data, std::int32_t from = 0) {
  return PutHeader{from, put_ack | put_notify, 1, addr, key, length, data};
}
std::uint64_t address_of(const void* p) { return reinterpret_cast<std::uint64_t>(p); }

TEST(UcxRmaOverActiveMessages, ForgedRequestsAndAnswersMoveNoBytes) {
  ContextPtr context = open_context();
  TransportParams params;
  params.rank = 0;
  params.serialized = true;
  params.copy = ShmCopy::copy;  // RMA to this host over active messages, the path under test
  std::unique_ptr<Transport> t = make_transport(*context, params);
  t->connect({t->address()});
  t->connected();

  std::vector<unsigned char> region(4096, 0);
  std::vector<unsigned char> read_only(64, 0);
  Registration* writable = t->register_memory(region.data(), region.size(), Access::remote_write | Access::remote_read);
  Registration* readable = t->register_memory(read_only.data(), read_only.size(), Access::remote_read);
  const std::uint64_t key = writable->key();
  const unsigned char bad[8] = {0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA};
  const unsigned char good[8] = {0x5A, 0x5A, 0x5A, 0x5A, 0x5A, 0x5A, 0x5A, 0x5A};
  {
    Forger f(t->address());
    const auto base = address_of(region.data());
    PutHeader h = put_header(base, key + 1000, 8, 1);  // no such registration
    f.send(kAmPut, &h, sizeof h, bad, 8);
    h = put_header(base + region.size() - 4, key, 8, 2);  // past the registration's end
    f.send(kAmPut, &h, sizeof h, bad, 8);
    h = put_header(base + 16, key, 4, 3);  // the header's length is not the message's
    f.send(kAmPut, &h, sizeof h, bad, 8);
    h = put_header(address_of(read_only.data()), readable->key(), 8, 4);  // not writable by peers
    f.send(kAmPut, &h, sizeof h, bad, 8);
    h = put_header(base + 32, key, 8, 5, 7);  // a sender that is no rank of this job
    f.send(kAmPut, &h, sizeof h, bad, 8);
    h = put_header(base + 40, key, 8, 6);
    f.send(kAmPut, &h, sizeof h - 8, bad, 8);  // a header of another size
    const RmaReply answer{0, 0, 12345, 0};     // answers to no operation of this rank's
    f.send(kAmGetReply, &answer, sizeof answer, bad, 8);
    f.send(kAmPutAck, &answer, sizeof answer, nullptr, 0);
    const GetHeader get{0, 0, 1, address_of(read_only.data()), key + 1000, 8};  // no such registration
    f.send(kAmGet, &get, sizeof get, nullptr, 0);
    h = put_header(base + 64, key, 8, 99);  // the control
    f.send(kAmPut, &h, sizeof h, good, 8);

    std::vector<Event> writes;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::memcmp(region.data() + 64, good, 8) != 0 && std::chrono::steady_clock::now() < deadline) {
      Event events[16];
      const int n = t->poll(events, 16);
      for (int i = 0; i < n; ++i) writes.push_back(events[i]);
      f.progress();
    }
    ASSERT_EQ(std::memcmp(region.data() + 64, good, 8), 0) << "the control put never arrived";
    for (int i = 0; i < 100; ++i) {  // whatever the control's poll left
      Event events[16];
      const int n = t->poll(events, 16);
      for (int k = 0; k < n; ++k) writes.push_back(events[k]);
    }
    ASSERT_EQ(writes.size(), 1u) << "only the control reports a remote write";
    EXPECT_TRUE(writes[0].remote_write);
    EXPECT_EQ(writes[0].data, 99u);
    EXPECT_EQ(writes[0].length, 8u);
    EXPECT_EQ(writes[0].rank, 0);
    EXPECT_EQ(writes[0].error, 0);
  }
  for (std::size_t i = 0; i < region.size(); ++i) {
    if (i >= 64 && i < 72) continue;
    ASSERT_EQ(region[i], 0) << "byte " << i << " of the registration was written";
  }
  for (unsigned char b : read_only) ASSERT_EQ(b, 0) << "a registration without remote write was written";
  t->deregister(writable);
  t->deregister(readable);
  t->cancel_all();
  t->close();
}

}  // namespace
