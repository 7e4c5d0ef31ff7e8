// pmix.cpp — client of a PMIx server (Open MPI's mpirun, prrte, Slurm with PMIx).
#include <pmix.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "bootstrap/kinds.hpp"
#include "common/log.hpp"
#include "ferry/error.hpp"

namespace ferry::bootstrap::detail {
namespace {

[[noreturn]] void fail(const std::string& what, pmix_status_t rc) {
  throw ferry::Error("bootstrap pmix: " + what + ": " + PMIx_Error_string(rc) + " (" + std::to_string(rc) + ")");
}

[[noreturn]] void fail(const std::string& what) { throw ferry::Error("bootstrap pmix: " + what); }

// Frees a pmix_value_t returned by PMIx_Get on every path, including throws.
struct ValueGuard {
  pmix_value_t* v = nullptr;
  ~ValueGuard() {
    if (v != nullptr) PMIX_VALUE_RELEASE(v);
  }
};

class Pmix final : public Bootstrap {
 public:
  Pmix() {
    pmix_status_t rc = PMIx_Init(&me_, nullptr, 0);
    if (rc != PMIX_SUCCESS) fail("PMIx_Init failed (is a PMIx server running this job?)", rc);
    try {
      rank_ = static_cast<int>(me_.rank);
      pmix_proc_t job;
      PMIX_PROC_LOAD(&job, me_.nspace, PMIX_RANK_WILDCARD);
      ValueGuard val;
      rc = PMIx_Get(&job, PMIX_JOB_SIZE, nullptr, 0, &val.v);
      if (rc != PMIX_SUCCESS) fail("PMIx_Get(" PMIX_JOB_SIZE ") for namespace '" + std::string(me_.nspace) + "'", rc);
      switch (val.v->type) {
        case PMIX_UINT32: size_ = static_cast<int>(val.v->data.uint32); break;
        case PMIX_UINT64: size_ = static_cast<int>(val.v->data.uint64); break;
        case PMIX_INT: size_ = val.v->data.integer; break;
        default:
          fail("PMIx_Get(" PMIX_JOB_SIZE ") returned data of type " + std::string(PMIx_Data_type_string(val.v->type)));
      }
      if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
        fail("the server reports rank " + std::to_string(rank_) + " in a job of size " + std::to_string(size_));
      }
    } catch (...) {
      PMIx_Finalize(nullptr, 0);
      throw;
    }
  }

  ~Pmix() override { PMIx_Finalize(nullptr, 0); }

  Pmix(const Pmix&) = delete;
  Pmix& operator=(const Pmix&) = delete;

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return size_; }
  [[nodiscard]] std::string_view kind() const override { return "pmix"; }

  void put(std::string_view key, std::string_view value) override {
    const std::string k = checked_key("put", key);
    // Every value goes out behind a one-byte tag, so no byte object is ever empty: with Open
    // MPI 4.1's server, an empty byte object in a collecting fence left later fences not
    // synchronising (PMIX_ERR_PARTIAL_SUCCESS on one rank, an immediate return on another).
    std::string tagged;
    tagged.reserve(value.size() + 1);
    tagged.push_back(kTag);
    tagged.append(value);
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = tagged.data();
    v.data.bo.size = tagged.size();
    const pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, k.c_str(), &v);
    if (rc != PMIX_SUCCESS) fail("PMIx_Put(key '" + k + "', " + std::to_string(value.size()) + " bytes)", rc);
  }

  void fence() override {
    pmix_status_t rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) fail("PMIx_Commit", rc);
    pmix_info_t info;
    PMIX_INFO_CONSTRUCT(&info);
    bool collect = true;
    PMIx_Info_load(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    rc = fence_all(&info, 1);
    PMIX_INFO_DESTRUCT(&info);
    if (rc != PMIX_SUCCESS) fail("PMIx_Fence (collecting data)", rc);
  }

  void barrier() override {
    const pmix_status_t rc = fence_all(nullptr, 0);
    if (rc != PMIX_SUCCESS) fail("PMIx_Fence (barrier)", rc);
  }

  [[nodiscard]] std::string get(int rank, std::string_view key) override {
    const std::string where = "get(rank " + std::to_string(rank) + ", key '" + std::string(key) + "')";
    if (rank < 0 || rank >= size_) fail(where + ": rank is out of range [0, " + std::to_string(size_) + ")");
    const std::string k = checked_key("get", key);
    pmix_proc_t peer;
    PMIX_PROC_LOAD(&peer, me_.nspace, static_cast<pmix_rank_t>(rank));
    // Everything put before the last fence is already local (the fence collected it), so a
    // key that is not here does not exist; without PMIX_OPTIONAL the client would ask the
    // server and wait for a put that never comes.
    pmix_info_t info;
    PMIX_INFO_CONSTRUCT(&info);
    bool optional = true;
    PMIx_Info_load(&info, PMIX_OPTIONAL, &optional, PMIX_BOOL);
    ValueGuard val;
    const pmix_status_t rc = PMIx_Get(&peer, k.c_str(), &info, 1, &val.v);
    PMIX_INFO_DESTRUCT(&info);
    if (rc == PMIX_ERR_NOT_FOUND) fail(where + ": not found");
    if (rc != PMIX_SUCCESS) fail("PMIx_Get " + where, rc);
    if (val.v == nullptr || val.v->type != PMIX_BYTE_OBJECT) {
      fail(where + ": the value is not a byte object; it was not put by ferry");
    }
    const pmix_byte_object_t& bo = val.v->data.bo;
    if (bo.size == 0 || bo.bytes == nullptr || bo.bytes[0] != kTag) {
      fail(where + ": the value does not carry ferry's tag; it was not put by ferry");
    }
    return std::string(bo.bytes + 1, bo.size - 1);
  }

  void abort(int code, std::string_view message) noexcept override {
    // mpirun 4.1 does not print the reason given to PMIx_Abort, so it goes to stderr too.
    // Always written, whatever FERRY_LOG says: it is the job's last word on why it ends.
    ::ferry::detail::log_line(::ferry::detail::LogLevel::error, rank_, -1, "aborting (exit code %d): %.*s", code, static_cast<int>(message.size()),
                 message.data());
    try {
      const std::string msg(message);
      PMIx_Abort(code, msg.c_str(), nullptr, 0);
    } catch (...) {
      // Only the copy of the message can throw; the launcher still learns nothing then,
      // but abort() promises not to throw.
    }
  }

 private:
  static std::string checked_key(const char* op, std::string_view key) {
    if (key.empty()) fail(std::string(op) + ": the key is empty");
    if (key.size() > PMIX_MAX_KEYLEN || key.find('\0') != std::string_view::npos) {
      fail(std::string(op) + ": key of " + std::to_string(key.size()) + " characters is longer than PMIx allows (" +
           std::to_string(PMIX_MAX_KEYLEN) + ") or contains a NUL");
    }
    return std::string(key);
  }

  pmix_status_t fence_all(const pmix_info_t* info, std::size_t ninfo) {
    pmix_proc_t all;
    PMIX_PROC_LOAD(&all, me_.nspace, PMIX_RANK_WILDCARD);
    return PMIx_Fence(&all, 1, info, ninfo);
  }

  static constexpr char kTag = 'f';

  pmix_proc_t me_{};
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Bootstrap> make_pmix() { return std::make_unique<Pmix>(); }

}  // namespace ferry::bootstrap::detail
