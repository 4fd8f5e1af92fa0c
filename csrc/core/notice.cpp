#include "core/notice.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace rsdp {

std::string without_rank_prefix(const std::string& msg) {
  const std::string p = "rsdp rank ";
  if (msg.compare(0, p.size(), p) != 0) return msg;
  size_t i = p.size();
  while (i < msg.size() && msg[i] >= '0' && msg[i] <= '9') ++i;
  if (i == p.size() || msg.compare(i, 2, ": ") != 0) return msg;
  return msg.substr(i + 2);
}

bool Notice::post(int origin, ErrorKind kind, const std::string& msg) {
  uint32_t none = 0;
  if (!block_->state.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) return false;
  const std::string text = without_rank_prefix(msg);
  block_->origin = origin;
  block_->kind = static_cast<uint32_t>(kind);
  block_->len = static_cast<uint32_t>(std::min(text.size(), kNoticeTextBytes));
  std::memcpy(block_->text, text.data(), block_->len);
  block_->state.store(2, std::memory_order_release);
  return true;
}

Failure Notice::read() const {
  // A post being written takes a memcpy; a writer that died in between
  // leaves the block unreadable, and its failure unknown.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
  while (block_->state.load(std::memory_order_acquire) == 1 &&
         std::chrono::steady_clock::now() < give_up)
    std::this_thread::yield();
  Failure f;
  if (!posted()) return f;
  f.origin = block_->origin;
  f.kind = static_cast<ErrorKind>(block_->kind);
  f.text.assign(block_->text, std::min<size_t>(block_->len, kNoticeTextBytes));
  return f;
}

std::string Notice::heard(const std::string& me, const std::string& doing, const Failure& f) {
  return detail::cat(me, ": ", doing, doing.empty() ? "" : ": ", "the group broke: ", f.text,
                     " (reported by rank ", f.origin, ")");
}

}  // namespace rsdp
