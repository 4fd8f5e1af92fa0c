// rsdp::Bootstrap on top of the process group's c10d::Store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <mutex>

#include "core/bootstrap.h"

namespace rsdp {

// Calls are serialised: the collective thread and the point-to-point thread
// of a group may both read a peer's UCX address when they first reach it
// (transport/ucx/net_comm.cpp), and not every c10d store is safe to share
// between threads mid-request. The UCX transport waits in short slices, so
// no caller holds the lock for long.
class StoreBootstrap : public Bootstrap {
 public:
  explicit StoreBootstrap(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> g(mu_);
    count();
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key) override {
    std::lock_guard<std::mutex> g(mu_);
    count();
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  std::vector<std::string> get_many(const std::vector<std::string>& keys) override {
    if (!store_->hasExtendedApi()) return Bootstrap::get_many(keys);
    std::lock_guard<std::mutex> g(mu_);
    count();
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (auto& v : store_->multiGet(keys)) out.emplace_back(v.begin(), v.end());
    return out;
  }
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> g(mu_);
    count();
    try {
      store_->wait(keys, timeout);
      return true;
    } catch (const c10::Error&) {  // DistStoreError on timeout
      return false;
    }
  }
  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> g(mu_);
    count();
    return store_->check({key});
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> g(mu_);
    count();
    return store_->add(key, delta);
  }

 private:
  std::mutex mu_;
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace rsdp
