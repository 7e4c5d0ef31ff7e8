// pmi_server.hpp — the PMI-1 wire protocol, as ferryrun serves it to its ranks.
//
// This is the text protocol MPICH's hydra speaks over PMI_FD: each message is one line of
// space-separated key=value pairs, the first of which is cmd=<command>. Keeping ferryrun
// wire-compatible with hydra means ferry's single PMI-1 client works under either launcher.
//
// The server knows nothing about sockets or processes: the launcher feeds it raw bytes per
// rank and it answers through the Transport callbacks. That keeps the protocol logic
// independent of the event loop and easy to reason about on its own.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ferryrun {

class PmiServer {
 public:
  struct Transport {
    // Queue one reply line (without its newline) for `rank`.
    std::function<void(int rank, std::string_view line)> send;
    // `rank` asked the launcher to end the job.
    std::function<void(int rank, int code, std::string_view message)> abort;
  };

  // Limits advertised through get_maxes and enforced on put.
  static constexpr std::size_t kKvsnameMax = 256;
  static constexpr std::size_t kKeyMax = 256;
  static constexpr std::size_t kValueMax = 4096;

  PmiServer(int size, std::string kvsname, Transport transport);

  // Bytes read from `rank`'s connection; may hold partial or several lines.
  void feed(int rank, std::string_view bytes);

  // `rank` closed its connection (exited or crashed). A half-sent line is dropped.
  void disconnect(int rank);

  [[nodiscard]] bool finalized(int rank) const { return ranks_.at(rank).finalized; }
  [[nodiscard]] const std::string& kvsname() const { return kvsname_; }

 private:
  using Fields = std::vector<std::pair<std::string, std::string>>;

  struct RankState {
    std::string pending;    // bytes after the last newline seen
    std::map<std::string, std::string> staged;  // puts not yet published by a barrier
    bool in_barrier = false;
    bool finalized = false;
    bool in_mcmd = false;   // inside a multi-line mcmd=... block, until endcmd
  };

  void handle_line(int rank, std::string_view line);
  void handle(int rank, const std::string& cmd, const Fields& fields);
  void put(int rank, const Fields& fields);
  void get(int rank, const Fields& fields);
  void barrier_in(int rank);
  void reply(int rank, const std::string& line) { transport_.send(rank, line); }

  static Fields parse(std::string_view line);
  static const std::string* find(const Fields& fields, std::string_view key);

  int size_;
  std::string kvsname_;
  Transport transport_;
  std::vector<RankState> ranks_;
  int barrier_count_ = 0;
  std::map<std::string, std::string, std::less<>> kvs_;
};

}  // namespace ferryrun
