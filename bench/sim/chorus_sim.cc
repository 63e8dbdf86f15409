// chorus's collectives at scale in SimGrid (S4U): the algorithms of core/src/net/algorithms.cc
// themselves, run by actors whose Links move simulated bytes (Note [Algorithms between hosts]),
// on a fat tree of N nodes. One point per run; bench/scale_out.py sweeps and plots.
//
//   chorus-sim --nodes N --ranks-per-node L --op OP --bytes B --scheme SCHEME [terms] [--cfg=...]
//
// Schemes:
//   chorus       what chorus runs (Note [Hierarchy]): shared memory in each node, and between
//                nodes the algorithm the cost model picks for the slice's size and N
//                (CHORUS_CROSS_ALGORITHM's names with --algorithm to force one). One actor per
//                node carries its L slices: L times the bytes on its links, each slice's fold
//                and copies on their own cores (1/L of the actor's).
//   ring, recursive_doubling, halving_doubling, tree
//                flat all_reduce over all N x L ranks, one actor per rank; messages inside a
//                node cross its loopback at the shared-memory terms (tree: binomial reduce, then
//                binomial broadcast)
//   two_level    NCCL-like: each node reduces to one leader (shared memory), the leaders run a
//                ring all_reduce of the whole buffer, each leader broadcasts in its node
// Terms (bench/scale_out.py holds this machine's, fitted to its namespace hosts):
//   --link-gbps, --link-lat-us   each fat-tree link (a route crosses 2 or 4)
//   --link-sharing               splitduplex (default: each direction its own bandwidth) or shared
//   --o-us                       a rank's own time per message it sends or receives
//   --fold-gbps                  folding one buffer into another
//   --shm-gbps, --shm-lat-us     a node's shared memory per rank (bus bandwidth) and step latency
//   --cost-alpha-us, --cost-gbps the network terms chorus's cost model picks with (default: what
//                                the platform gives a message between two nodes); --cost-fold-gbps
//                                and --cost-o-us its other two (default: --fold-gbps, --o-us)
//   --testbed CORES              instead of a fat tree, the namespace hosts of bench/hosts_bench.sh:
//                                every rank on one machine of CORES cores, whose kernel carries
//                                every message (one link, both directions sharing --link-gbps;
//                                then --link-lat-us over a veth pair between hosts, or
//                                --loopback-lat-us inside one), and the ranks' own time (--o-us,
//                                folds, copies, shared memory, wake-ups) is work on those cores,
//                                one rank per actor; a host's ranks meet in each shared-memory
//                                step; rank 0's time is its call's after a barrier, as
//                                bench/chorus-bench times it
//   --kernel-copy-gbps           the testbed's kernel copying a message into or out of a socket
//                                (the sender's and the receiver's time); --cached-copy-gbps for a
//                                message of up to --cache-kib
//   --socket-buffer-kib          a send up to this size is done for its sender once copied
//   --wake-us                    a testbed rank's time to be woken when it slept for a message
//   --crowd                      with more testbed ranks than cores, each one's per-message time
//                                (--o-us, --wake-us, --shm-lat-us) grows by this much for every
//                                rank per core beyond the first (as the ranks' run time per
//                                message grows here, docs/scale-out.md)
// Prints: op,bytes,nodes,ranks_per_node,scheme,algorithm,seconds,busbw_GBps,rank0_seconds
// (seconds: until every rank is done, the testbed's barrier included; rank0_seconds: rank 0's own
// time in the call, what the benchmarks time)
#include <simgrid/s4u.hpp>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "net/algorithms.h"
#include "net/cost_model.h"
#include "shm/segment.h"

namespace sg4 = simgrid::s4u;
using chorus::OpKind;
using namespace chorus::net;

namespace {

struct Terms {
  double link_gbps = 10, link_lat_us = 10, o_us = 2, fold_gbps = 40, shm_gbps = 40, shm_lat_us = 2;
  double cost_alpha_us = -1, cost_gbps = -1, cost_fold_gbps = -1, cost_o_us = -1;
  bool shared_links = false;  // both directions of a link share its bandwidth (one CPU copying both ways)
  int testbed_cores = 0;      // > 0: --testbed
  double kernel_copy_gbps = 40, socket_buffer_kib = 2048;  // the testbed's kernel
  double loopback_lat_us = -1;  // the testbed's messages inside a namespace host (< 0: --link-lat-us)
  double wake_us = 0;           // the testbed's rank's time to be woken by a message it slept for
  double crowd = 0;             // the testbed's per-message work (o, wake, shm-lat) x (1 + crowd (ranks / cores - 1))
  double cache_kib = 0, cached_copy_gbps = 0;  // the kernel's copies of messages up to cache_kib (0: none)
  // The testbed's kernel copying a message into or out of a socket, s: faster while it fits in cache.
  double kernel_copy(size_t bytes) const {
    const bool cached = cache_kib > 0 && double(bytes) <= cache_kib * 1024;
    return double(bytes) * 8 / ((cached ? cached_copy_gbps : kernel_copy_gbps) * 1e9);
  }
};

// Rank 0's time in the call (the testbed's: from the barrier before it), what the benchmarks time.
double rank0_done = 0;

constexpr double kSpeed = 1e9;  // every host's flop/s: `seconds` of a rank's own time are seconds * kSpeed flops

sg4::Host* testbed_machine = nullptr;  // --testbed: the cores every rank's own time runs on

// A rank's own time: its own core's on a fat tree; on the testbed, work that shares the machine's
// cores (the actors live on their namespace hosts, which only route their messages).
void busy(const Terms& t, double seconds) {
  if (seconds <= 0) return;
  if (t.testbed_cores)
    sg4::this_actor::exec_init(seconds * kSpeed)->set_host(testbed_machine)->wait();
  else
    sg4::this_actor::sleep_for(seconds);
}

int token;  // every message's payload: only its simulated size matters

// The testbed's socket from one actor to another: bytes sent into it and bytes the receiver has
// taken out (TCP's flow control holds a sender whose unread bytes fill the socket's buffer).
struct Pipe {
  double sent = 0, taken = 0;
  sg4::MutexPtr mu = sg4::Mutex::create();
  sg4::ConditionVariablePtr cv = sg4::ConditionVariable::create();
};
std::map<std::pair<int, int>, Pipe> pipes;
Pipe& pipe_of(int from, int to) { return pipes[{from, to}]; }

std::string mailbox(int from, int to) { return std::to_string(from) + ">" + std::to_string(to); }

// A rank's (or an aggregated node's) view of its peers in the simulation. `scale`: the share of
// this actor's folds and copies that one core does (1/L when the actor carries L slices).
class SimLinks : public Links {
 public:
  SimLinks(int rank, int size, const Terms& t, double scale, std::vector<int> actor_ids = {})
      : rank_(rank), size_(size), t_(t), scale_(scale), ids_(std::move(actor_ids)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void exchange(const std::vector<Move>& moves) override {
    std::vector<sg4::CommPtr> comms;
    size_t folded = 0;
    double copy_in = 0, copy_out = 0;  // the testbed's kernel copies of what is sent and received, s
    busy(t_, double(moves.size()) * t_.o_us * 1e-6);
    for (const auto& m : moves) (m.send ? copy_in : copy_out) += t_.kernel_copy(m.span.bytes);
    // On the testbed the sender's kernel copies its data into the socket, and a send that fits in
    // the socket's buffer is done for the sender then, unless earlier ones the peer has not yet
    // taken fill it (TCP's flow control: the sender waits for the peer to take them).
    if (t_.testbed_cores) busy(t_, copy_in);
    for (const auto& m : moves) {
      const int me = id(rank_), peer = id(m.peer);
      if (m.send) {
        auto* box = sg4::Mailbox::by_name(mailbox(me, peer));
        const double buffer = t_.socket_buffer_kib * 1024, bytes = double(m.span.bytes);
        Pipe* pipe = t_.testbed_cores ? &pipe_of(me, peer) : nullptr;
        if (pipe && bytes <= buffer) {
          std::unique_lock<sg4::Mutex> lock(*pipe->mu);
          while (pipe->sent > pipe->taken && pipe->sent - pipe->taken + bytes > buffer) pipe->cv->wait(lock);
          pipe->sent += bytes;
          lock.unlock();
          box->put_init(&token, m.span.bytes + 16)->detach();
        } else {
          if (pipe) pipe->sent += bytes;
          comms.push_back(box->put_async(&token, m.span.bytes + 16));
        }
      } else {
        auto* box = sg4::Mailbox::by_name(mailbox(peer, me));
        box->set_receiver(sg4::Actor::self());  // eager: data flows as soon as it is sent, as on TCP
        int* sink = nullptr;
        comms.push_back(box->get_async<int>(&sink));
        // Folded as it arrives: on a fat tree only the last grain is left after the data, on the
        // testbed every byte's fold takes the shared cores' time.
        if (m.fold)
          folded =
              t_.testbed_cores ? folded + m.span.bytes : std::max(folded, std::min<size_t>(m.span.bytes, 64 << 10));
      }
    }
    // On the testbed a rank whose messages are not all in when it waits for them sleeps, and being
    // woken and scheduled again takes the cores' time (more ranks than cores: one another's).
    const bool sleeps =
        t_.testbed_cores && std::any_of(comms.begin(), comms.end(), [](const sg4::CommPtr& c) { return !c->test(); });
    sg4::Comm::wait_all(comms);
    if (sleeps) busy(t_, t_.wake_us * 1e-6);
    if (t_.testbed_cores) {
      busy(t_, copy_out);
      for (const auto& m : moves)  // out of the sockets: their senders may go on
        if (!m.send) {
          Pipe& pipe = pipe_of(id(m.peer), id(rank_));
          const std::lock_guard<sg4::Mutex> lock(*pipe.mu);
          pipe.taken += double(m.span.bytes);
          pipe.cv->notify_all();
        }
    }
    if (folded) busy(t_, double(folded) * scale_ * 8 / (t_.fold_gbps * 1e9));
  }
  void copy(Span from, Span) override { busy(t_, double(from.bytes) * scale_ * 8 / (t_.shm_gbps * 1e9)); }
  void fold(Span into, Span, Span) override { busy(t_, double(into.bytes) * scale_ * 8 / (t_.fold_gbps * 1e9)); }
  void reserve_tmp(size_t) override {}

 private:
  int id(int r) const { return ids_.empty() ? r : ids_[size_t(r)]; }
  int rank_, size_;
  Terms t_;
  double scale_;
  std::vector<int> ids_;
};

// Steps inside a node: shared memory moving `bytes` per rank in `calls` calls.
void shm_step(const Terms& t, double bytes, int calls = 1) {
  busy(t, calls * t.shm_lat_us * 1e-6 + bytes * 8 / (t.shm_gbps * 1e9));
}

// The testbed's ranks of one node meeting in shared memory: a step waits for every rank of the
// node, or (a broadcast's) for its root only, whose rank leaves once it has posted its data
// (Note [Owed waits]). Steps are counted per rank, in the order every rank takes them.
struct Meeting {
  sg4::MutexPtr mu = sg4::Mutex::create();
  sg4::ConditionVariablePtr cv = sg4::ConditionVariable::create();
  std::map<int, int> arrived;  // step -> ranks that reached it
  std::map<int, bool> posted;  // step -> its root has posted
};
std::vector<Meeting> meetings;  // one per node

// One rank's shared-memory step `k` on the testbed: meets its node (from < 0: every rank; else the
// root, the node's rank `from`), a rank that slept for it paying its wake-up, then the step's own
// time. (No spinning: the namespace hosts' ranks outnumber the machine's cores, and chorus's
// waits count them all, Note [Ranks sharing the cores].)
void shm_meet(const Terms& t, int node, int local, int size, int k, int from, double bytes, int calls) {
  Meeting& m = meetings[size_t(node)];
  bool slept = false;
  {
    std::unique_lock<sg4::Mutex> lock(*m.mu);
    ++m.arrived[k];
    if (local == from) m.posted[k] = true;
    m.cv->notify_all();
    while (from < 0 ? m.arrived[k] < size : local != from && !m.posted[k]) {
      m.cv->wait(lock);
      slept = true;
    }
  }
  if (slept) busy(t, t.wake_us * 1e-6);
  if (local == from && bytes <= chorus::shm::kInlineBytes) return;  // a tiny broadcast's root posts in its line, leaves
  shm_step(t, bytes, calls);
}

// The fat tree of N nodes: 32 per leaf switch, each leaf with one uplink to each spine (non-blocking).
// On the testbed: the machine's cores, and a host per namespace host to route the messages.
std::string platform(int nodes, const Terms& t) {
  char path[] = "/tmp/chorus-sim-XXXXXX";
  const int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  if (t.testbed_cores) {
    // The machine's cores, and a host per namespace host: every message crosses the kernel (one
    // bandwidth, both directions sharing it), then a veth pair between two namespace hosts or the
    // loopback inside one, each with its own latency.
    std::ofstream xml(path);
    const double lo = t.loopback_lat_us >= 0 ? t.loopback_lat_us : t.link_lat_us;
    xml << "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
        << "<platform version=\"4.1\">\n<zone id=\"testbed\" routing=\"Full\">\n<host id=\"machine\" speed=\"1Gf\" "
        << "core=\"" << t.testbed_cores << "\"/>\n";
    for (int n = 0; n < nodes; ++n) xml << "<host id=\"ns-" << n << "\" speed=\"1Gf\"/>\n";
    xml << "<link id=\"kernel\" bandwidth=\"" << t.link_gbps << "Gbps\" latency=\"0us\" sharing_policy=\"SHARED\"/>\n"
        << "<link id=\"veth\" bandwidth=\"1e6Gbps\" latency=\"" << t.link_lat_us
        << "us\" sharing_policy=\"FATPIPE\"/>\n"
        << "<link id=\"lo\" bandwidth=\"1e6Gbps\" latency=\"" << lo << "us\" sharing_policy=\"FATPIPE\"/>\n";
    for (int a = 0; a < nodes; ++a)
      for (int b = a; b < nodes; ++b)
        xml << "<route src=\"ns-" << a << "\" dst=\"ns-" << b << "\"><link_ctn id=\"kernel\"/><link_ctn id=\""
            << (a == b ? "lo" : "veth") << "\"/></route>\n";
    xml << "</zone>\n</platform>\n";
    return path;
  }
  const int per_leaf = std::min(nodes, 32), leaves = (nodes + per_leaf - 1) / per_leaf;
  std::ofstream xml(path);
  xml << "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
      << "<platform version=\"4.1\">\n<cluster id=\"fabric\" prefix=\"node-\" radical=\"0-" << nodes - 1
      << "\" suffix=\"\" speed=\"1Gf\" core=\"64\" bw=\"" << t.link_gbps << "Gbps\" lat=\"" << t.link_lat_us << "us\""
      << " loopback_bw=\"" << t.shm_gbps << "Gbps\" loopback_lat=\"" << t.shm_lat_us << "us\""
      << " sharing_policy=\"" << (t.shared_links ? "SHARED" : "SPLITDUPLEX") << "\"";
  if (leaves > 1)
    xml << " topology=\"FAT_TREE\" topo_parameters=\"2;" << per_leaf << "," << leaves << ";1," << per_leaf << ";1,1\"";
  xml << "/>\n</platform>\n";
  return path;
}

double bus_factor(OpKind op, int p) {
  if (op == OpKind::AllReduce) return 2.0 * (p - 1) / p;
  if (op == OpKind::Broadcast) return 1.0;
  return double(p - 1) / p;
}

OpKind parse_op(const std::string& s) {
  for (OpKind k : {OpKind::Barrier, OpKind::AllReduce, OpKind::Broadcast, OpKind::AllGather, OpKind::ReduceScatter})
    if (s == chorus::to_string(k)) return k;
  std::fprintf(stderr, "chorus-sim: unknown op %s\n", s.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  sg4::Engine engine(&argc, argv);
  int nodes = 2, per_node = 1;
  size_t bytes = 8;
  std::string op_name = "all_reduce", scheme = "chorus", forced;
  Terms t;
  const std::map<std::string, double*> terms = {{"--link-gbps", &t.link_gbps},
                                                {"--link-lat-us", &t.link_lat_us},
                                                {"--o-us", &t.o_us},
                                                {"--fold-gbps", &t.fold_gbps},
                                                {"--shm-gbps", &t.shm_gbps},
                                                {"--shm-lat-us", &t.shm_lat_us},
                                                {"--cost-alpha-us", &t.cost_alpha_us},
                                                {"--cost-gbps", &t.cost_gbps},
                                                {"--cost-fold-gbps", &t.cost_fold_gbps},
                                                {"--cost-o-us", &t.cost_o_us},
                                                {"--kernel-copy-gbps", &t.kernel_copy_gbps},
                                                {"--socket-buffer-kib", &t.socket_buffer_kib},
                                                {"--loopback-lat-us", &t.loopback_lat_us},
                                                {"--wake-us", &t.wake_us},
                                                {"--crowd", &t.crowd},
                                                {"--cache-kib", &t.cache_kib},
                                                {"--cached-copy-gbps", &t.cached_copy_gbps}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--nodes")
      nodes = std::atoi(v);
    else if (k == "--ranks-per-node")
      per_node = std::atoi(v);
    else if (k == "--bytes")
      bytes = size_t(std::atoll(v));
    else if (k == "--op")
      op_name = v;
    else if (k == "--scheme")
      scheme = v;
    else if (k == "--algorithm")
      forced = v;
    else if (auto it = terms.find(k); it != terms.end())
      *it->second = std::atof(v);
    else if (k == "--link-sharing")
      t.shared_links = std::string(v) == "shared";
    else if (k == "--testbed")
      t.testbed_cores = std::atoi(v);
    else {
      std::fprintf(stderr, "chorus-sim: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const OpKind op = parse_op(op_name);
  const std::string xml = platform(nodes, t);
  engine.load_platform(xml);
  std::remove(xml.c_str());
  std::vector<sg4::Host*> hosts(static_cast<size_t>(nodes));
  for (int n = 0; n < nodes; ++n)
    hosts[size_t(n)] = engine.host_by_name((t.testbed_cores ? "ns-" : "node-") + std::to_string(n));
  if (t.testbed_cores) testbed_machine = engine.host_by_name("machine");

  // chorus's cost model, with the terms a message between two nodes sees (or those given).
  NetCost cost;
  const int hops = t.testbed_cores ? 1 : nodes > 32 ? 4 : 2;
  cost.alpha = (t.cost_alpha_us > 0 ? t.cost_alpha_us : hops * t.link_lat_us) * 1e-6;
  cost.beta = 8.0 / ((t.cost_gbps > 0 ? t.cost_gbps : t.link_gbps) * 1e9);
  cost.gamma = 8.0 / ((t.cost_fold_gbps > 0 ? t.cost_fold_gbps : t.fold_gbps) * 1e9);
  cost.o = (t.cost_o_us > 0 ? t.cost_o_us : t.o_us) * 1e-6;
  std::map<std::string, std::string> force;
  if (!forced.empty()) force = parse_forced(forced, "--algorithm");

  const int L = per_node, P = nodes * per_node;
  // The testbed's ranks sharing a core: each one's per-message work grows with them.
  if (t.testbed_cores && P > t.testbed_cores && t.crowd > 0) {
    const double f = 1 + t.crowd * (double(P) / t.testbed_cores - 1);
    t.o_us *= f, t.wake_us *= f, t.shm_lat_us *= f;
  }
  const size_t elem = 4;
  std::string algorithm = scheme;
  if (scheme == "chorus") {
    // Note [Hierarchy]: per-slice sizes as communicator/hierarchy.cc cuts them.
    const bool small = bytes < (64 << 10) || bytes / elem < size_t(L);
    size_t slice = bytes;
    if (op == OpKind::AllReduce && !small && L > 1) slice = bytes / size_t(L);
    if (op == OpKind::Broadcast && !small && L > 1) slice = bytes / size_t(L);
    // The node's L slices share its link, and each chooses with 1/L of it (communicator/hierarchy.cc).
    NetCost shared = cost;
    shared.beta *= L;
    const Algorithm a = op == OpKind::Barrier ? Algorithm::Binomial : choose(op, slice, nodes, shared, force);
    algorithm = op == OpKind::Barrier ? "dissemination" : algorithm_name(a);
    // One actor's steps of the op: `links` between the nodes, carrying `carried` bytes of slices;
    // `root_slice` the links of the slice that alone crosses in a small broadcast (null: not this
    // actor's).
    // `shm(bytes, calls, from)`: a step inside the node (from: the broadcast's root rank in the
    // node, or -1 for a step of every rank).
    using Shm = std::function<void(double, int, int)>;
    auto steps = [=](int n, SimLinks& links, SimLinks* root_slice, size_t carried, const Shm& shm) {
      switch (op) {
        case OpKind::AllReduce:
          if (L > 1) shm(small ? 2.0 * bytes * (L - 1) / L : double(bytes) * (L - 1) / L, 1, -1);
          if (nodes > 1) all_reduce(links, carried / elem, elem, a);
          if (L > 1 && !small) shm(double(bytes) * (L - 1) / L, 1, -1);
          break;
        case OpKind::Broadcast:
          if (small) {
            if (nodes > 1 && root_slice) broadcast(*root_slice, bytes, 0, a, chain_segments(slice, nodes, shared));
            if (L > 1) shm(double(bytes), 1, 0);
          } else {
            if (L > 1 && n == 0) shm(double(bytes), 1, 0);
            if (nodes > 1) broadcast(links, carried, 0, a, chain_segments(slice, nodes, shared));
            if (L > 1 && n != 0) shm(double(bytes) * (L - 1) / L, 1, -1);
          }
          break;
        case OpKind::AllGather:
          if (nodes > 1) all_gather(links, carried, a);
          if (L > 1 && bytes * size_t(P) < (64 << 10))  // one call, then the blocks put in order
            shm(double(bytes) * nodes * (L - 1) + double(bytes) * P, 1, -1);
          else if (L > 1)  // a call per node's blocks, straight into place
            shm(double(bytes) * nodes * (L - 1), nodes, -1);
          break;
        case OpKind::ReduceScatter:
          if (L > 1) shm(double(bytes) * P + double(bytes) * nodes * (L - 1), 1, -1);  // the reorder, then in-node
          if (nodes > 1) reduce_scatter(links, carried / elem, elem, a);
          break;
        default:
          if (L > 1) shm(0, 1, -1);
          if (nodes > 1) barrier(links);
      }
    };
    if (t.testbed_cores) {
      // Every rank an actor: its slice's links between the nodes, and the group's compare of the
      // call (Note [Comparing calls]: a max-reduction of 24 bytes by recursive doubling over
      // every rank) through the same kernel.
      meetings.resize(size_t(nodes));
      for (int n = 0; n < nodes; ++n)
        for (int i = 0; i < L; ++i)
          sg4::Actor::create("rank-" + std::to_string(n * L + i), hosts[size_t(n)], [=] {
            std::vector<int> ids;
            for (int m = 0; m < nodes; ++m) ids.push_back(m * L + i);
            SimLinks links(n, nodes, t, 1.0, ids), check(n * L + i, P, t, 1.0);
            int k = 0;
            const Shm shm = [&](double b, int calls, int from) { shm_meet(t, n, i, L, k++, from, b, calls); };
            // As bench/chorus-bench times a call: a barrier, then rank 0's clock over the call.
            if (P > 1) all_reduce(check, 3, 8, Algorithm::RecursiveDoubling);
            if (L > 1) shm(0, 1, -1);
            if (nodes > 1) barrier(links);
            const double start = sg4::Engine::get_clock();
            if (P > 1) all_reduce(check, 3, 8, Algorithm::RecursiveDoubling);
            steps(n, links, i == 0 ? &links : nullptr, slice, shm);
            if (n == 0 && i == 0) rank0_done = sg4::Engine::get_clock() - start;
          });
    } else {
      // One actor per node carries its L slices: L times a slice's bytes on the node's links.
      for (int n = 0; n < nodes; ++n)
        sg4::Actor::create("node-" + std::to_string(n), hosts[size_t(n)], [=] {
          SimLinks links(n, nodes, t, 1.0 / L), one(n, nodes, t, 1.0);
          // The compare's rounds inside a node over shared memory, then between the nodes.
          if (L > 1) busy(t, std::ceil(std::log2(double(L))) * (2 * t.o_us + t.shm_lat_us) * 1e-6);
          if (nodes > 1) {
            SimLinks check(n, nodes, t, 1.0);
            all_reduce(check, 3, 8, Algorithm::RecursiveDoubling);
          }
          steps(n, links, &one, slice * size_t(L), [&](double b, int calls, int) { shm_step(t, b, calls); });
          if (n == 0) rank0_done = sg4::Engine::get_clock();
        });
    }
  } else if (scheme == "two_level") {
    for (int n = 0; n < nodes; ++n)
      sg4::Actor::create("node-" + std::to_string(n), hosts[size_t(n)], [=] {
        SimLinks links(n, nodes, t, 1.0);
        if (L > 1) shm_step(t, double(bytes) * (L - 1));  // the leader reads every rank's buffer
        if (nodes > 1) all_reduce(links, bytes / elem, elem, Algorithm::Ring);
        if (L > 1) shm_step(t, double(bytes));
      });
  } else {
    Algorithm a = Algorithm::Ring;
    if (scheme != "tree" && !parse_algorithm(scheme, &a)) {
      std::fprintf(stderr, "chorus-sim: unknown scheme %s\n", scheme.c_str());
      return 2;
    }
    for (int r = 0; r < P; ++r)
      sg4::Actor::create("rank-" + std::to_string(r), hosts[size_t(r / L)], [=] {
        SimLinks links(r, P, t, 1.0);
        if (scheme == "tree") {
          reduce(links, bytes / elem, elem, 0);
          broadcast(links, bytes, 0, Algorithm::Binomial);
        } else {
          all_reduce(links, bytes / elem, elem, a);
        }
      });
  }
  engine.run();
  const double seconds = sg4::Engine::get_clock();
  const double alg = op == OpKind::AllGather || op == OpKind::ReduceScatter ? double(bytes) * P : double(bytes);
  std::printf("%s,%zu,%d,%d,%s,%s,%.9g,%.6g,%.9g\n", op_name.c_str(), bytes, nodes, L, scheme.c_str(),
              algorithm.c_str(), seconds, seconds > 0 ? alg / seconds / 1e9 * bus_factor(op, P) : 0.0,
              rank0_done > 0 ? rank0_done : seconds);
  return 0;
}
