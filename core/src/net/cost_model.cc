#include "net/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "chorus/core/error.h"

namespace chorus::net {
namespace {

double log2_ceil(int p) { return std::ceil(std::log2(double(std::max(p, 1)))); }
int power_of_two_below(int p) {
  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  return p2;
}

}  // namespace

NetCost parse_cost(const std::string& text) {
  NetCost c;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    double v = 0;
    char rest = 0;
    if (eq == std::string::npos || std::sscanf(item.c_str() + eq + 1, "%lf%c", &v, &rest) != 1 || !(v > 0))
      throw InvalidArgument(detail::concat("CHORUS_CROSS_COST: '", item,
                                           "' is not key=positive number (keys: alpha_us, gbps, fold_gbps, o_us)"));
    if (key == "alpha_us")
      c.alpha = v * 1e-6;
    else if (key == "gbps")
      c.beta = 8.0 / (v * 1e9);
    else if (key == "fold_gbps")
      c.gamma = 8.0 / (v * 1e9);
    else if (key == "o_us")
      c.o = v * 1e-6;
    else
      throw InvalidArgument(
          detail::concat("CHORUS_CROSS_COST: unknown term '", key, "' (keys: alpha_us, gbps, fold_gbps, o_us)"));
  }
  return c;
}

std::map<std::string, std::string> parse_forced(const std::string& text, const std::string& what) {
  std::map<std::string, std::string> out;
  std::stringstream in(text);
  std::string item;
  const std::vector<OpKind> ops = {OpKind::AllReduce, OpKind::ReduceScatter, OpKind::AllGather, OpKind::Broadcast};
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string op = eq == std::string::npos ? "*" : item.substr(0, eq);
    const std::string name = eq == std::string::npos ? item : item.substr(eq + 1);
    Algorithm a;
    if (!parse_algorithm(name, &a))
      throw InvalidArgument(detail::concat(what, ": unknown algorithm '", name,
                                           "' (recursive_doubling, ring, halving_doubling, direct, binomial, "
                                           "scatter_ring, chain)"));
    bool fits = op == "*";
    for (OpKind k : ops)
      if (op == to_string(k)) {
        const auto c = candidates(k);
        if (std::find(c.begin(), c.end(), a) == c.end())
          throw InvalidArgument(detail::concat(what, ": ", op, " cannot run '", name, "'"));
        fits = true;
      }
    if (!fits)
      throw InvalidArgument(detail::concat(what, ": '", op,
                                           "' has no choice of algorithm (all_reduce, reduce_scatter, all_gather, "
                                           "broadcast have)"));
    out[op] = name;
  }
  return out;
}

std::string describe_cost(const NetCost& c) {
  char text[160];
  std::snprintf(text, sizeof text, "alpha %.1f us, %.2f Gb/s, fold %.2f Gb/s, o %.1f us", c.alpha * 1e6,
                8.0 / c.beta / 1e9, 8.0 / c.gamma / 1e9, c.o * 1e6);
  return text;
}

std::string cost_setting(const NetCost& c) {
  char text[200];
  std::snprintf(text, sizeof text, "alpha_us=%.6g,gbps=%.6g,fold_gbps=%.6g,o_us=%.6g", c.alpha * 1e6,
                8.0 / c.beta / 1e9, 8.0 / c.gamma / 1e9, c.o * 1e6);
  return text;
}

std::vector<Algorithm> candidates(OpKind op) {
  switch (op) {
    case OpKind::AllReduce: return {Algorithm::RecursiveDoubling, Algorithm::HalvingDoubling, Algorithm::Ring};
    case OpKind::ReduceScatter: return {Algorithm::Direct, Algorithm::Ring};
    case OpKind::AllGather: return {Algorithm::Direct, Algorithm::Ring};
    case OpKind::Broadcast: return {Algorithm::Binomial, Algorithm::ScatterRing, Algorithm::Chain};
    default: return {};
  }
}

double predict(OpKind op, Algorithm a, size_t bytes, int p, const NetCost& c) {
  if (p <= 1) return 0;
  const double n = double(bytes), P = p, step = c.alpha + 2 * c.o;  // one message each way per step
  const int p2 = power_of_two_below(p);
  const double lg2 = std::log2(double(p2));
  // The ranks beyond a power of two hand in their data first and get the result last.
  const double extras = p2 < p ? 2 * (step + n * c.beta) + n * c.gamma : 0;
  switch (op) {
    case OpKind::AllReduce:
      if (a == Algorithm::RecursiveDoubling) return lg2 * (step + n * c.beta + n * c.gamma) + extras;
      if (a == Algorithm::HalvingDoubling)
        return 2 * lg2 * step + 2 * (p2 - 1) / double(p2) * n * c.beta + (p2 - 1) / double(p2) * n * c.gamma + extras;
      return 2 * (P - 1) * step + 2 * (P - 1) / P * n * c.beta + (P - 1) / P * n * c.gamma;
    case OpKind::ReduceScatter:
      if (a == Algorithm::Direct) return c.alpha + 2 * (P - 1) * c.o + (P - 1) * n * (c.beta + c.gamma);
      return (P - 1) * (step + n * (c.beta + c.gamma));
    case OpKind::AllGather:
      if (a == Algorithm::Direct) return c.alpha + 2 * (P - 1) * c.o + (P - 1) * n * c.beta;
      return (P - 1) * (step + n * c.beta);
    case OpKind::Broadcast:
      if (a == Algorithm::Chain) {
        // The segments stream: each hop's latency is paid once, while the pipe fills; then every
        // step costs its two messages' overhead and a segment's bytes.
        const double s = double(chain_segments(bytes, p, c));
        return (P - 1) * c.alpha + (P - 2 + s) * (2 * c.o + n / s * c.beta);
      }
      if (a == Algorithm::ScatterRing)
        return c.alpha + (P - 1) * c.o + (P - 1) / P * n * c.beta + (P - 1) * (step + n / P * c.beta);
      return log2_ceil(p) * (step + n * c.beta);  // the root's children share its link, round by round
    default: return 0;
  }
}

size_t chain_segments(size_t bytes, int p, const NetCost& c) {
  if (p <= 2) return 1;
  const double best = std::sqrt(double(p - 2) * double(bytes) * c.beta / std::max(2 * c.o, 1e-9));
  const double most = std::max(1.0, double(bytes) / double(16 << 10));
  return size_t(std::clamp(std::round(best), 1.0, most));
}

Algorithm choose(OpKind op, size_t bytes, int p, const NetCost& c, const std::map<std::string, std::string>& forced) {
  const auto options = candidates(op);
  for (const std::string& key : {std::string(to_string(op)), std::string("*")})
    if (auto it = forced.find(key); it != forced.end()) {
      Algorithm a;
      if (parse_algorithm(it->second, &a) && std::find(options.begin(), options.end(), a) != options.end()) return a;
    }
  Algorithm best = options.empty() ? Algorithm::Binomial : options.front();
  double least = 0;
  for (size_t i = 0; i < options.size(); ++i) {
    const double t = predict(op, options[i], bytes, p, c);
    if (i == 0 || t < least) best = options[i], least = t;
  }
  return best;
}

}  // namespace chorus::net
