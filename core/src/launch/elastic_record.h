// What the agents of an elastic job keep in their stores, and the keys they share with their
// workers (Note [Elastic rendezvous] in elastic_agent.cc; chorus/core/elastic.h on the workers'
// side).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/core/elastic_agent.h"

namespace chorus::elastic_record {

// In an agent's own store.
constexpr const char* kState = "state";                // its acceptor Record
constexpr const char* kInfo = "info";                  // "<configuration>\n" + encode_node(itself)
constexpr const char* kWaiting = "waiting";            // encode_node() lines: nodes that wait to join
constexpr const char* kClosed = "closed";              // "finished", or "failed <why>"
constexpr const char* kRequestKey = "worker/request";  // "<round> <why>": a worker asks for a round
std::string ports_key(int64_t round);                  // node 0's "<store port> <program port>"
std::string worker_key(int local_rank);                // a worker's place: "<round>\nKEY=VALUE..."

// In a round's store.
constexpr const char* kWaitingKey = "chorus/elastic/nodes_waiting";
constexpr const char* kWatchingKey = "chorus/elastic/watching";
constexpr const char* kReformKey = "chorus/elastic/reform";
constexpr const char* kInProcessKey = "chorus/elastic/in_process";

// "node <id> <host> <addr> <port>"
std::string encode_node(const NodeInfo& n);
// The nodes of the "node ..." lines of text.
std::vector<NodeInfo> decode_nodes(const std::string& text);

// One agent's acceptor record (the value under kState).
struct Record {
  int64_t promised = -1;  // round number of the highest proposal promised
  std::string promiser;   // its proposer's id
  Round accepted;
  bool go = false;

  bool outranks(int64_t round, const std::string& id) const {
    return promised > round || (promised == round && promiser > id);
  }
  std::string encode() const;
  static Record decode(const std::string& text);
};

// "addr:port"
std::string where(const std::string& addr, int port);
// "a (1.2.3.4), b (1.2.3.5)", or "none"
std::string names(const std::vector<NodeInfo>& nodes);

}  // namespace chorus::elastic_record
