// The UCX worker addresses of a group's ranks, read from the store when a
// rank is first reached (docs/scale.md: endpoints on first use).
//
// Every rank publishes its record (both workers' addresses) once, when its
// NetComm is made; a peer's is read the first time this rank sends to or
// receives from it, by either engine, and kept: one store request per peer
// actually used instead of every rank reading all of them at set-up. A peer
// may not have published yet (it is still setting up) or never will (it
// died first): get() waits for it in short slices up to the caller's
// deadline, running the caller's own checks between them, and then names
// the peer.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/bootstrap.h"
#include "core/deadline.h"
#include "core/group.h"

namespace rsdp {

class UcxAddressBook {
 public:
  // `coll` and `p2p`: this rank's own worker addresses (published here, and
  // the reference for a peer's address format). `group` and `store` must
  // outlive this object.
  UcxAddressBook(const Group& group, Bootstrap& store, std::string coll, std::string p2p);

  struct Pair {
    std::string coll, p2p;  // as UCX reads them (padded; see ucx_address_book.cpp)
  };
  // Group rank `peer`'s addresses. Waits for its record until `dl`, calling
  // `between` (which may throw) after each slice. Any thread. Throws
  // rsdp::Error: kTimeout when the peer never published by `dl`, kSystem
  // when its record is malformed.
  Pair get(int peer, const Deadline& dl, const std::function<void()>& between = nullptr);
  // Without waiting: false when `peer` has not published (yet). Throws
  // kSystem when its record is malformed.
  bool try_get(int peer, Pair& out);
  // True once `peer`'s record was read (no store request).
  bool known(int peer);
  std::string key(int peer) const;

 private:
  bool load(int peer, Pair& out);  // reads and checks a record known to exist

  const Group& group_;
  Bootstrap& store_;
  std::string coll_, p2p_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Pair>> known_;  // guarded by mu_
};

}  // namespace rsdp
