// Note [Agreement]
// A collective whose ranks pass different things must fail on every rank, saying what each rank
// passed: an error on one rank alone leaves the others waiting in the next call. Two rules,
// written once here:
//   - require_same: every rank passes a text describing its call (a list of tensors, a
//     collection's signature, the names it gathers, a checkpoint's outline). The ranks compare
//     64-bit hashes first; only when they differ do the texts travel, and every rank raises
//     CollectiveMismatch with one message format: "<what> on group '<name>': <rule>:" and a line
//     per rank. Texts of several lines (a checkpoint's outline) show the first line where a rank
//     differs from rank 0; any text is cut at 300 characters.
//   - fail_together: a step that runs user code or touches files (reading a checkpoint's
//     metadata, building a catalog) runs on every rank, whatever it throws caught; the ranks
//     exchange the messages and all throw the first failing rank's, naming every rank it failed
//     on (DCP's _DistWrapper does the same for its steps).
// Both catch with run_caught, as does the object collectives' producer (objects/collective.cc),
// whose failure travels in the value's place so that every rank raises, naming the rank.
#include "groups/agreement.h"

#include <algorithm>
#include <numeric>
#include <string_view>

#include "chorus/core/error.h"

namespace chorus::detail {

namespace {

constexpr size_t kShownChars = 300;

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// Where the texts span lines: the index of the first line on which some rank differs from rank 0.
size_t first_differing_line(const std::vector<std::string>& texts) {
  size_t first = SIZE_MAX;
  for (const std::string& t : texts) {
    size_t at = 0, line = 0;
    while (at < t.size() && at < texts[0].size() && t[at] == texts[0][at]) line += t[at++] == '\n';
    if (t != texts[0]) first = std::min(first, line);
  }
  return first == SIZE_MAX ? 0 : first;
}

std::string_view line_of(std::string_view text, size_t line) {
  for (size_t i = 0; i < line; ++i) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return {};
    text.remove_prefix(nl + 1);
  }
  return text.substr(0, text.find('\n'));
}

}  // namespace

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& text) {
  const size_t w = size_t(comm.size());
  uint64_t mine = text.size();
  std::vector<uint64_t> lengths(w);
  comm.all_gather(&mine, lengths.data(), 1, DataType::Int64);
  std::vector<size_t> counts(lengths.begin(), lengths.end());
  std::string all(std::accumulate(counts.begin(), counts.end(), size_t(0)), '\0');
  comm.all_gather_v(text.data(), all.data(), counts, DataType::UInt8);
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t n : counts) {
    out.push_back(all.substr(at, n));
    at += n;
  }
  return out;
}

void require_same(Communicator& comm, const std::string& what, const std::string& rule, const std::string& text) {
  if (comm.size() == 1) return;
  const uint64_t mine = fnv1a(text);
  std::vector<uint64_t> all(size_t(comm.size()));
  comm.all_gather(&mine, all.data(), 1, DataType::Int64);
  if (std::all_of(all.begin(), all.end(), [&](uint64_t h) { return h == all[0]; })) return;
  throw_mismatch(comm, what, rule, all_gather_strings(comm, text));
}

void throw_mismatch(Communicator& comm, const std::string& what, const std::string& rule,
                    std::vector<std::string> texts) {
  const bool lines =
      std::any_of(texts.begin(), texts.end(), [](const std::string& t) { return t.find('\n') != std::string::npos; });
  const size_t line = lines ? first_differing_line(texts) : 0;
  std::string shown;
  for (size_t r = 0; r < texts.size(); ++r) {
    std::string_view t = lines ? line_of(texts[r], line) : std::string_view(texts[r]);
    shown += concat("\n  rank ", r, ": ", t.substr(0, kShownChars), t.size() > kShownChars ? "..." : "");
  }
  throw CollectiveMismatch(concat(what, " on group '", comm.name(), "': ", rule, ":", shown), std::move(texts));
}

Caught run_caught(const std::function<void()>& fn) {
  Caught c;
  try {
    fn();
  } catch (const InvalidArgument& e) {
    c = {std::current_exception(), e.what(), true};
  } catch (const std::exception& e) {
    c = {std::current_exception(), e.what(), false};
  } catch (...) {
    c = {std::current_exception(), "an exception that is not a std::exception", false};
  }
  return c;
}

void fail_together(Communicator& comm, const std::function<void()>& fn) {
  const Caught caught = run_caught(fn);
  const std::string mine = caught ? concat(caught.invalid_argument ? "I" : "E", caught.message) : std::string();
  const std::vector<std::string> all = all_gather_strings(comm, mine);
  std::string failed;
  int first = -1;
  for (int r = 0; r < int(all.size()); ++r) {
    if (all[size_t(r)].empty()) continue;
    if (first < 0) first = r;
    failed += concat(failed.empty() ? "" : ", ", r);
  }
  if (first < 0) return;
  const std::string& e = all[size_t(first)];
  const std::string what = all.size() == 1 ? e.substr(1) : concat(e.substr(1), " (failed on rank ", failed, ")");
  if (e[0] == 'I') throw InvalidArgument(what);
  throw Error(what);
}

}  // namespace chorus::detail
