// The key-value rendezvous the transports use to find each other. The c10d
// glue implements it on top of the process group's c10d::Store, which keeps
// torch headers out of the transports.
#pragma once

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
  // Waits until every key exists; false if the timeout passed first.
  virtual bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual bool check(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

}  // namespace rsdp
