// The key-value rendezvous the transports use to find each other. The c10d
// glue implements it on top of the process group's c10d::Store, which keeps
// torch headers out of the transports.
//
// Every call is one request to the store (a wait or get_many over k keys is
// one request, which the store answers in O(k)); requests() counts them where
// the implementation does, so that set-up can be held to O(1) requests per
// rank outside group rank 0 (core/group.cpp, docs/scale.md).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace rsdp {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of a key that is known to exist (callers wait() first).
  virtual std::string get(const std::string& key) = 0;
  // The values of keys known to exist, in order. This default asks once per
  // key; a store that can answer them in one request overrides it.
  virtual std::vector<std::string> get_many(const std::vector<std::string>& keys) {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(get(k));
    return out;
  }
  // Waits until every key exists; false if the timeout passed first.
  virtual bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual bool check(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Requests made so far through this object (0 where it does not count).
  int64_t requests() const { return requests_.load(std::memory_order_relaxed); }

 protected:
  void count(int64_t n = 1) { requests_.fetch_add(n, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> requests_{0};
};

}  // namespace rsdp
