// rsdp::Bootstrap on top of the process group's c10d::Store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "core/bootstrap.h"

namespace rsdp {

class StoreBootstrap : public Bootstrap {
 public:
  explicit StoreBootstrap(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key) override {
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      store_->wait(keys, timeout);
      return true;
    } catch (const c10::Error&) {  // DistStoreError on timeout
      return false;
    }
  }
  bool check(const std::string& key) override { return store_->check({key}); }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace rsdp
