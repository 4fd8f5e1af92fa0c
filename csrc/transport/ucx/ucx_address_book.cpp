// See ucx_address_book.h.
#include "transport/ucx/ucx_address_book.h"

#include "core/error.h"
#include "core/store_records.h"

namespace rsdp {
namespace {

// UCX reads a worker address with no length (ucp_ep_create follows the
// format as far as it leads) and aborts the process on an address version it
// does not know (an assertion in ucp_address_unpack). So a peer's address must
// carry the version this rank's UCX writes, the low 4 bits of its first byte
// (without this check most garbage addresses abort the process; the
// ucx-address-garbage case of tests/backend/test_hostile_peer.py), and goes
// to UCX followed by zeros, so that a malformed one is read inside this
// buffer until UCX refuses it. UCX parses the rest itself.
constexpr size_t kAddressPad = 4096;

std::string check_address(std::string peer, const std::string& mine, const char* which,
                          std::string& err) {
  const unsigned theirs = static_cast<unsigned char>(peer[0]) & 0xf;
  const unsigned ours = static_cast<unsigned char>(mine[0]) & 0xf;
  if (theirs != ours && err.empty())
    err = detail::cat("its ", which, " UCX address is of format version ", theirs,
                      ", this rank's UCX writes version ", ours,
                      " (a different UCX, or not a UCX address)");
  peer.append(kAddressPad, '\0');
  return peer;
}

// How long one wait for a peer's record lasts: the caller's checks (an
// abort, a failure notice) run this often while a peer is late.
constexpr auto kSlice = std::chrono::milliseconds(50);

}  // namespace

UcxAddressBook::UcxAddressBook(const Group& group, Bootstrap& store, std::string coll,
                           std::string p2p)
    : group_(group), store_(store), coll_(std::move(coll)), p2p_(std::move(p2p)) {
  known_.resize(group_.size);
  if (group_.size > 1)
    store_.set(key(group_.rank), records::encode_ucx(group_.rank, coll_, p2p_));
}

std::string UcxAddressBook::key(int peer) const {
  return group_.key("ucx/addr/" + std::to_string(peer));
}

bool UcxAddressBook::load(int peer, Pair& out) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (known_[peer]) {
      out = *known_[peer];
      return true;
    }
  }
  const std::string k = key(peer);
  const std::string doing =
      detail::cat(group_.me(), ": connecting to ", group_.who(peer), " in group '", group_.name,
                  "': ");
  records::UcxAddresses a;
  std::string err = records::decode_ucx(store_.get(k), {k, peer, group_.who(peer)}, a);
  RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), doing, err);
  Pair p;
  p.coll = check_address(std::move(a.coll), coll_, "collective", err);
  p.p2p = check_address(std::move(a.p2p), p2p_, "point-to-point", err);
  RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), doing, "the UCX address record of ",
                  group_.who(peer), " (store key '", k, "'): ", err);
  std::lock_guard<std::mutex> g(mu_);
  if (!known_[peer]) known_[peer] = std::make_unique<Pair>(std::move(p));
  out = *known_[peer];
  return true;
}

UcxAddressBook::Pair UcxAddressBook::get(int peer, const Deadline& dl,
                                     const std::function<void()>& between) {
  Pair out;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (known_[peer]) return *known_[peer];
  }
  const std::string k = key(peer);
  while (!store_.wait({k}, kSlice)) {
    if (between) between();
    if (dl.expired())
      RSDP_FAIL(ErrorKind::kTimeout, group_.me(), ": ", timed_out_waiting(dl.budget().count()),
                " for ", group_.who(peer), " to publish its UCX address in group '",
                group_.name, "' (it never finished setting up the group, or died before)");
  }
  load(peer, out);
  return out;
}

bool UcxAddressBook::known(int peer) {
  std::lock_guard<std::mutex> g(mu_);
  return known_[peer] != nullptr;
}

bool UcxAddressBook::try_get(int peer, Pair& out) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (known_[peer]) {
      out = *known_[peer];
      return true;
    }
  }
  return store_.check(key(peer)) && load(peer, out);
}

}  // namespace rsdp
