#include "launch/elastic_record.h"

#include <sstream>

namespace chorus {

using detail::concat;

namespace elastic_record {

std::string ports_key(int64_t round) { return concat("ports/", round); }
std::string worker_key(int local_rank) { return concat("worker/", local_rank); }

std::string encode_node(const NodeInfo& n) { return concat("node ", n.id, " ", n.host, " ", n.addr, " ", n.port); }

std::vector<NodeInfo> decode_nodes(const std::string& text) {
  std::vector<NodeInfo> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string tag;
    NodeInfo n;
    if (in >> tag && tag == "node" && in >> n.id >> n.host >> n.addr >> n.port) out.push_back(n);
  }
  return out;
}

std::string Record::encode() const {
  std::string out = concat("promise ", promised, " ", promiser.empty() ? "-" : promiser, "\n", "round ",
                           accepted.number, " ", accepted.restarts, " ", int(go), "\n");
  for (const auto& m : accepted.members) out += encode_node(m) + "\n";
  return out;
}

Record Record::decode(const std::string& text) {
  Record r;
  std::istringstream in(text);
  std::string tag;
  int go = 0;
  in >> tag >> r.promised >> r.promiser >> tag >> r.accepted.number >> r.accepted.restarts >> go;
  if (r.promiser == "-") r.promiser.clear();
  r.go = go != 0;
  std::string rest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  r.accepted.members = decode_nodes(rest);
  return r;
}

std::string where(const std::string& addr, int port) { return concat(addr, ":", port); }

std::string names(const std::vector<NodeInfo>& nodes) {
  std::string out;
  for (const auto& n : nodes) out += (out.empty() ? "" : ", ") + n.name();
  return out.empty() ? "none" : out;
}

}  // namespace elastic_record

std::string NodeInfo::name() const { return concat(host, " (", addr, ")"); }

int Round::node_rank_of(const std::string& id) const {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].id == id) return int(i);
  return -1;
}

std::vector<std::pair<std::string, int>> parse_endpoints(const std::string& list, int default_port) {
  std::vector<std::pair<std::string, int>> out;
  std::istringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    std::string host = item;
    int port = default_port;
    const size_t colon = item.rfind(':');
    if (colon != std::string::npos && item.find(']') == std::string::npos ? true : colon > item.find(']')) {
      if (colon != std::string::npos) {
        host = item.substr(0, colon);
        try {
          size_t used = 0;
          port = std::stoi(item.substr(colon + 1), &used);
          if (used != item.size() - colon - 1) throw std::invalid_argument("trailing");
        } catch (const std::exception&) {
          throw InvalidArgument(concat("--rdzv-endpoint: '", item, "' is not host[:port]"));
        }
      }
    }
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host.empty() || port <= 0 || port > 65535)
      throw InvalidArgument(concat("--rdzv-endpoint: '", item, "' is not host[:port] with a port in 1..65535"));
    out.emplace_back(host, port);
  }
  if (out.empty()) throw InvalidArgument("--rdzv-endpoint: no host given");
  return out;
}

}  // namespace chorus
