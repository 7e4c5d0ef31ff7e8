// ferry-launch-probe — a stand-in rank for testing launchers (ferryrun, mpiexec.hydra).
//
// It carries its own tiny PMI-1 client instead of linking ferry, so launcher tests keep
// working while the library is broken, and a mismatch between ferryrun and hydra shows up
// here rather than inside ferry's bootstrap.
//
// Usage: ferry-launch-probe MODE [ARGS...]
//   ok                  init, put/get own and a peer's key, barrier, finalize, print "rank r of N ok"
//   exit RANK CODE      after a barrier RANK exits with CODE; the others sleep 60 s
//   crash RANK          every rank creates /dev/shm/<pid>:0:0; after a barrier RANK raises SIGSEGV
//   abort RANK CODE     after a barrier RANK sends PMI abort with CODE; the others sleep 60 s
//   hang                every rank sleeps 600 s
//   stubborn            every rank ignores SIGTERM and sleeps 600 s
//   spawn-child FILE    every rank forks a grandchild that sleeps 600 s and appends its pid to
//                       FILE; after a barrier rank 0 crashes and the others sleep
//   early-exit          rank 0 exits 0 without finalize; the others sleep 1 s, then finish
//   protocol            exercise partial lines, errors and the informational commands
//   output              write lines to stdout and stderr, ending with an unterminated line
//   env                 print the launcher-related environment
//   args ARGS...        print the arguments it got
// Every mode that talks PMI first prints "rank R pid P" so tests can check what was left.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <map>
#include <string>
#include <sys/resource.h>
#include <unistd.h>

namespace {

int g_rank = -1;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "probe rank %d: %s\n", g_rank, what.c_str());
  std::exit(99);
}

// Minimal PMI-1 client: one request, one reply line, parsed into key=value pairs.
class Pmi {
 public:
  Pmi() {
    const char* fd = std::getenv("PMI_FD");
    const char* rank = std::getenv("PMI_RANK");
    const char* size = std::getenv("PMI_SIZE");
    if (!fd || !rank || !size) die("PMI_FD, PMI_RANK or PMI_SIZE not set");
    fd_ = std::atoi(fd);
    rank_ = g_rank = std::atoi(rank);
    size_ = std::atoi(size);
  }
  int rank() const { return rank_; }
  int size() const { return size_; }

  void write_raw(const std::string& bytes) {
    for (std::size_t off = 0; off < bytes.size();) {
      ssize_t n = ::write(fd_, bytes.data() + off, bytes.size() - off);
      if (n <= 0) die("write to PMI_FD failed");
      off += static_cast<std::size_t>(n);
    }
  }
  std::map<std::string, std::string> read_reply() {
    std::size_t nl;
    while ((nl = buf_.find('\n')) == std::string::npos) {
      char tmp[4096];
      ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n <= 0) die("PMI connection closed");
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
    std::string line = buf_.substr(0, nl);
    buf_.erase(0, nl + 1);
    std::map<std::string, std::string> kv;
    for (std::size_t pos = 0; pos < line.size();) {
      std::size_t end = line.find(' ', pos);
      if (end == std::string::npos) end = line.size();
      std::string tok = line.substr(pos, end - pos);
      std::size_t eq = tok.find('=');
      if (eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
      pos = end + 1;
    }
    return kv;
  }
  // Sends one command and insists on the reply's cmd and, unless told otherwise, rc=0.
  std::map<std::string, std::string> call(const std::string& req, const std::string& want,
                                          bool need_ok = true) {
    write_raw(req + "\n");
    auto kv = read_reply();
    if (kv["cmd"] != want) die("'" + req + "': expected cmd=" + want + ", got cmd=" + kv["cmd"]);
    if (need_ok && kv.count("rc") && kv["rc"] != "0") die("'" + req + "' failed: rc=" + kv["rc"]);
    return kv;
  }

  void init() {
    call("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init");
    kvs_ = call("cmd=get_my_kvsname", "my_kvsname")["kvsname"];
    std::printf("rank %d pid %d\n", rank_, static_cast<int>(::getpid()));
  }
  void put(const std::string& k, const std::string& v) {
    call("cmd=put kvsname=" + kvs_ + " key=" + k + " value=" + v, "put_result");
  }
  std::string get(const std::string& k) {
    return call("cmd=get kvsname=" + kvs_ + " key=" + k, "get_result")["value"];
  }
  void barrier() { call("cmd=barrier_in", "barrier_out"); }
  void finalize() { call("cmd=finalize", "finalize_ack"); }
  const std::string& kvs() const { return kvs_; }

 private:
  int fd_ = -1, rank_ = 0, size_ = 0;
  std::string buf_, kvs_;
};

void expect(bool ok, const std::string& what) {
  if (!ok) die("check failed: " + what);
}

void crash() {
  rlimit none{0, 0};
  ::setrlimit(RLIMIT_CORE, &none);  // a test crash should not leave core files around
  std::fflush(stdout);
  std::raise(SIGSEGV);
}

void protocol(Pmi& pmi) {
  const std::string n = std::to_string(pmi.size());
  // A request split across writes must be reassembled by the server.
  pmi.write_raw("cmd=get_");
  ::usleep(100 * 1000);
  pmi.write_raw("maxes\n");
  auto kv = pmi.read_reply();
  expect(kv["cmd"] == "maxes" && kv["vallen_max"] == "4096" && kv["rc"] == "0", "get_maxes");
  // Two requests in one write must both be answered, in order.
  pmi.write_raw("cmd=get_appnum\ncmd=get_universe_size\n");
  kv = pmi.read_reply();
  expect(kv["cmd"] == "appnum" && kv["appnum"] == "0", "get_appnum");
  kv = pmi.read_reply();
  expect(kv["cmd"] == "universe_size" && kv["size"] == n, "get_universe_size");
  expect(pmi.get("PMI_process_mapping") == "(vector,(0,1," + n + "))", "PMI_process_mapping");
  kv = pmi.call("cmd=get kvsname=" + pmi.kvs() + " key=nope", "get_result", false);
  expect(kv["rc"] == "-1" && kv["msg"] == "key_not_found", "missing key");
  kv = pmi.call("cmd=frobnicate x=1", "frobnicate_result", false);
  expect(kv["rc"] == "-1" && kv["msg"] == "unknown_command", "unknown command");
  kv = pmi.call("cmd=put kvsname=wrong key=k value=v", "put_result", false);
  expect(kv["rc"] == "-1", "put to a wrong kvsname");
  kv = pmi.call("cmd=put kvsname=" + pmi.kvs() + " key=big value=" + std::string(4097, 'x'),
                "put_result", false);
  expect(kv["rc"] == "-1", "oversized value");
  // Puts become visible at the next barrier, as under hydra.
  pmi.put("big-" + std::to_string(pmi.rank()), std::string(4096, 'y'));
  kv = pmi.call("cmd=get kvsname=" + pmi.kvs() + " key=big-" + std::to_string(pmi.rank()),
                "get_result", false);
  expect(kv["rc"] == "-1", "a put visible before the barrier");
  pmi.barrier();
  expect(pmi.get("big-" + std::to_string(pmi.rank())) == std::string(4096, 'y'),
         "maximal value round trip");
  pmi.barrier();
  pmi.finalize();
  std::printf("rank %d protocol ok\n", pmi.rank());
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  auto arg = [&](int i) { return i < argc ? std::atoi(argv[i]) : -1; };

  if (mode == "args") {
    for (int i = 2; i < argc; ++i) std::printf("arg %d: %s\n", i - 1, argv[i]);
    return 0;
  }
  if (mode == "env") {
    for (const char* v : {"PMI_FD", "PMI_RANK", "PMI_SIZE", "FERRY_LAUNCHER", "PMIX_RANK",
                          "PMIX_NAMESPACE", "PMI_PORT"}) {
      const char* val = std::getenv(v);
      std::printf("%s=%s\n", v, val ? val : "<unset>");
    }
    return 0;
  }
  if (mode == "output") {
    std::printf("out line 1\nout line 2\n");
    std::fflush(stdout);
    std::fprintf(stderr, "err line 1\n");
    std::printf("unterminated");
    return 0;
  }

  Pmi pmi;
  pmi.init();
  const int me = pmi.rank();
  if (mode == "ok") {
    pmi.put("probe-" + std::to_string(me), "hello-" + std::to_string(me));
    pmi.barrier();
    const int peer = (me + 1) % pmi.size();
    expect(pmi.get("probe-" + std::to_string(peer)) == "hello-" + std::to_string(peer), "peer key");
    expect(pmi.get("probe-" + std::to_string(me)) == "hello-" + std::to_string(me), "own key");
    pmi.barrier();
    pmi.finalize();
    std::printf("rank %d of %d ok\n", me, pmi.size());
  } else if (mode == "exit" || mode == "crash" || mode == "abort") {
    if (mode == "crash") {
      // Stands in for the shared-memory segment libfabric's shm provider would leave.
      std::string path = "/dev/shm/" + std::to_string(::getpid()) + ":0:0";
      int fd = ::open(path.c_str(), O_CREAT | O_WRONLY, 0600);
      if (fd >= 0) ::close(fd);
    }
    pmi.barrier();
    if (me == arg(2)) {
      if (mode == "exit") return arg(3);
      if (mode == "crash") crash();
      pmi.write_raw("cmd=abort exitcode=" + std::to_string(arg(3)) + " msg=probe gave up\n");
    }
    ::sleep(60);
  } else if (mode == "hang" || mode == "stubborn") {
    if (mode == "stubborn") std::signal(SIGTERM, SIG_IGN);
    ::sleep(600);
  } else if (mode == "spawn-child") {
    if (argc < 3) die("spawn-child needs a FILE");
    pid_t child = ::fork();
    if (child == 0) {
      ::sleep(600);
      ::_exit(0);
    }
    std::string line = std::to_string(child) + "\n";
    int fd = ::open(argv[2], O_CREAT | O_WRONLY | O_APPEND, 0644);
    if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      die("cannot record the grandchild pid");
    ::close(fd);
    pmi.barrier();
    if (me == 0) crash();
    ::sleep(600);
  } else if (mode == "early-exit") {
    if (me == 0) return 0;
    ::sleep(1);
    pmi.finalize();
    std::printf("rank %d done\n", me);
  } else if (mode == "protocol") {
    protocol(pmi);
  } else {
    die("unknown mode '" + mode + "'");
  }
  return 0;
}
