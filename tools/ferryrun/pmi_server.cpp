// pmi_server.cpp — PMI-1 wire protocol: parsing, the shared key-value store and the barrier.
#include "pmi_server.hpp"

#include <charconv>
#include <string>
#include <utility>

namespace ferryrun {

PmiServer::PmiServer(int size, std::string kvsname, Transport transport)
    : size_(size), kvsname_(std::move(kvsname)), transport_(std::move(transport)), ranks_(size) {}

void PmiServer::feed(int rank, std::string_view bytes) {
  RankState& st = ranks_.at(rank);
  st.pending.append(bytes);
  std::size_t start = 0;
  for (std::size_t nl; (nl = st.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(st.pending.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    handle_line(rank, line);
  }
  st.pending.erase(0, start);
  // A client that never sends a newline must not make the launcher grow without bound; the
  // largest legal line is a put with maximal key and value plus a little framing.
  constexpr std::size_t kLineMax = kKvsnameMax + kKeyMax + kValueMax + 256;
  if (st.pending.size() > kLineMax) {
    st.pending.clear();
    reply(rank, "cmd=error rc=-1 msg=line_too_long");
  }
}

void PmiServer::disconnect(int rank) {
  RankState& st = ranks_.at(rank);
  st.pending.clear();
  st.in_mcmd = false;
}

PmiServer::Fields PmiServer::parse(std::string_view line) {
  Fields fields;
  std::size_t pos = 0;
  while (pos < line.size()) {
    std::size_t end = line.find(' ', pos);
    if (end == std::string_view::npos) end = line.size();
    std::string_view tok = line.substr(pos, end - pos);
    pos = end + 1;
    if (tok.empty()) continue;
    std::size_t eq = tok.find('=');
    if (eq == std::string_view::npos) {
      // A word without '=' continues the previous value: this is how a free-text abort
      // message ("msg=out of memory") survives the space-separated framing.
      if (!fields.empty()) fields.back().second.append(" ").append(tok);
      continue;
    }
    fields.emplace_back(std::string(tok.substr(0, eq)), std::string(tok.substr(eq + 1)));
  }
  return fields;
}

const std::string* PmiServer::find(const Fields& fields, std::string_view key) {
  for (const auto& [k, v] : fields)
    if (k == key) return &v;
  return nullptr;
}

void PmiServer::handle_line(int rank, std::string_view line) {
  RankState& st = ranks_.at(rank);
  if (st.in_mcmd) {
    // Multi-line commands (only spawn uses them) are unsupported; swallow the body and
    // answer once at its end so the client sees exactly one reply.
    if (line == "endcmd") {
      st.in_mcmd = false;
      reply(rank, "cmd=spawn_result rc=-1 msg=spawn_not_supported");
    }
    return;
  }
  Fields fields = parse(line);
  if (fields.empty()) return;  // blank line: nothing asked, nothing to answer
  if (fields.front().first == "mcmd") {
    st.in_mcmd = true;
    return;
  }
  if (fields.front().first != "cmd") {
    reply(rank, "cmd=error rc=-1 msg=missing_cmd");
    return;
  }
  handle(rank, fields.front().second, fields);
}

void PmiServer::handle(int rank, const std::string& cmd, const Fields& fields) {
  const std::string n = std::to_string(size_);
  if (cmd == "init") {
    // Only version 1 is spoken here; a client asking for PMI-2 over this socket is told so
    // with a non-zero rc rather than being answered in the wrong dialect.
    const std::string* ver = find(fields, "pmi_version");
    if (ver && *ver != "1") {
      reply(rank, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1");
      return;
    }
    reply(rank, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0");
  } else if (cmd == "get_maxes") {
    reply(rank, "cmd=maxes kvsname_max=" + std::to_string(kKvsnameMax) +
                    " keylen_max=" + std::to_string(kKeyMax) +
                    " vallen_max=" + std::to_string(kValueMax) + " rc=0");
  } else if (cmd == "get_appnum") {
    reply(rank, "cmd=appnum appnum=0 rc=0");
  } else if (cmd == "get_my_kvsname") {
    reply(rank, "cmd=my_kvsname kvsname=" + kvsname_ + " rc=0");
  } else if (cmd == "get_universe_size") {
    reply(rank, "cmd=universe_size size=" + n + " rc=0");
  } else if (cmd == "put") {
    put(rank, fields);
  } else if (cmd == "get") {
    get(rank, fields);
  } else if (cmd == "barrier_in") {
    barrier_in(rank);
  } else if (cmd == "finalize") {
    ranks_.at(rank).finalized = true;
    reply(rank, "cmd=finalize_ack");
  } else if (cmd == "abort") {
    int code = 1;
    if (const std::string* c = find(fields, "exitcode")) {
      int parsed = 0;
      auto [p, ec] = std::from_chars(c->data(), c->data() + c->size(), parsed);
      if (ec == std::errc() && p == c->data() + c->size()) code = parsed;
    }
    // An abort is a failure whatever code it carries, and the launcher's own exit status
    // can only hold 8 bits, so fold the code into 1..255.
    code &= 0xff;
    if (code == 0) code = 1;
    const std::string* msg = find(fields, "msg");
    if (!msg) msg = find(fields, "message");
    transport_.abort(rank, code, msg ? std::string_view(*msg) : std::string_view());
  } else {
    reply(rank, "cmd=" + cmd + "_result rc=-1 msg=unknown_command");
  }
}

void PmiServer::put(int rank, const Fields& fields) {
  const std::string* kvs = find(fields, "kvsname");
  const std::string* key = find(fields, "key");
  const std::string* value = find(fields, "value");
  const char* error = nullptr;
  if (!kvs || !key || !value) error = "missing_kvsname_key_or_value";
  else if (*kvs != kvsname_) error = "kvsname_not_found";
  else if (key->empty()) error = "empty_key";
  else if (key->size() > kKeyMax) error = "key_too_long";
  else if (value->size() > kValueMax) error = "value_too_long";
  if (error) {
    reply(rank, std::string("cmd=put_result rc=-1 msg=") + error);
    return;
  }
  // Held back until this rank's next barrier_in, which is when hydra's proxy forwards puts
  // too. A client that forgets to fence before get fails here as it would under mpiexec,
  // rather than only in production. Later puts overwrite earlier ones.
  ranks_.at(rank).staged[*key] = *value;
  reply(rank, "cmd=put_result rc=0");
}

void PmiServer::get(int rank, const Fields& fields) {
  const std::string* kvs = find(fields, "kvsname");
  const std::string* key = find(fields, "key");
  if (!kvs || !key) {
    reply(rank, "cmd=get_result rc=-1 msg=missing_kvsname_or_key value=unknown");
    return;
  }
  if (*kvs != kvsname_) {
    reply(rank, "cmd=get_result rc=-1 msg=kvsname_not_found value=unknown");
    return;
  }
  if (*key == "PMI_process_mapping") {
    // All ranks share this one node: one block of `size` consecutive ranks on node 0.
    reply(rank, "cmd=get_result rc=0 value=(vector,(0,1," + std::to_string(size_) + "))");
    return;
  }
  auto it = kvs_.find(*key);
  if (it == kvs_.end()) {
    reply(rank, "cmd=get_result rc=-1 msg=key_not_found value=unknown");
    return;
  }
  reply(rank, "cmd=get_result rc=0 value=" + it->second);
}

void PmiServer::barrier_in(int rank) {
  RankState& st = ranks_.at(rank);
  if (st.in_barrier) {
    // Entering twice without leaving would count this rank twice and release the barrier
    // early for everyone else.
    reply(rank, "cmd=barrier_out rc=-1 msg=already_in_barrier");
    return;
  }
  st.in_barrier = true;
  for (auto& [k, v] : st.staged) kvs_[k] = std::move(v);
  st.staged.clear();
  if (++barrier_count_ < size_) return;
  barrier_count_ = 0;
  for (int r = 0; r < size_; ++r) {
    ranks_[r].in_barrier = false;
    reply(r, "cmd=barrier_out");
  }
}

}  // namespace ferryrun
