// Standalone test of csrc/backend/op_queue.cpp, the worker queue of a process
// group, with threads that wait by running queued tasks themselves
// (OpQueue::help, [Note: waiting runs the op] in csrc/backend/work_rsdp.cpp):
// every task runs exactly once, in push order, one at a time, whichever thread
// runs it; help() returns true only once its task has run; stop(false) cancels
// what is left. Run under ThreadSanitizer by scripts/run_tests.sh.
//   g++ -O1 -std=c++17 -pthread -I csrc tests/native/test_op_queue.cpp csrc/backend/op_queue.cpp
//   ./a.out      last line "N passed, M failed"; exit code != 0 on failure
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/op_queue.h"
#include "check.h"

using rsdp::OpQueue;

namespace {

struct Log {
  std::mutex mu;
  std::vector<int> order;      // task ids in the order they ran
  std::atomic<int> running{0}; // tasks running at once: never more than one
  std::atomic<int> overlap{0};
  std::atomic<int> cancelled{0};
};

OpQueue::Task task(Log& log, int id, std::atomic<bool>& done) {
  return [&log, id, &done](bool run) {
    if (!run) {
      log.cancelled.fetch_add(1);
    } else {
      if (log.running.fetch_add(1) != 0) log.overlap.fetch_add(1);
      {
        std::lock_guard<std::mutex> g(log.mu);
        log.order.push_back(id);
      }
      std::this_thread::yield();
      log.running.fetch_sub(1);
    }
    done.store(true, std::memory_order_release);
  };
}

// Threads push tasks (one pusher keeps the order) while waiters, each on a task
// of its own, help until it has run; the worker takes what they leave.
void many_waiters() {
  constexpr int kTasks = 400, kWaiters = 4;
  Log log;
  std::unique_ptr<std::atomic<bool>[]> done(new std::atomic<bool>[kTasks]);
  for (int i = 0; i < kTasks; ++i) done[i].store(false);
  OpQueue q;
  std::atomic<int> pushed{0};
  std::atomic<int> helped_early{0};
  std::thread pusher([&] {
    for (int i = 0; i < kTasks; ++i) {
      q.push(task(log, i, done[i]));
      pushed.store(i + 1, std::memory_order_release);
      if (i % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  std::vector<std::thread> waiters;
  for (int w = 0; w < kWaiters; ++w)
    waiters.emplace_back([&, w] {
      for (int i = w; i < kTasks; i += kWaiters) {
        while (pushed.load(std::memory_order_acquire) <= i) std::this_thread::yield();
        // help() is true only with the task run; false leaves it to the worker.
        if (q.help(done[i])) {
          if (!done[i].load()) helped_early.fetch_add(1);
        } else {
          while (!done[i].load(std::memory_order_acquire)) std::this_thread::yield();
        }
      }
    });
  pusher.join();
  for (auto& t : waiters) t.join();
  q.stop(true);
  CHECK(helped_early.load() == 0, "help() returned true before its task ran (%d)",
        helped_early.load());
  CHECK(log.overlap.load() == 0, "%d tasks ran while another was running", log.overlap.load());
  CHECK(static_cast<int>(log.order.size()) == kTasks, "%zu of %d tasks ran", log.order.size(),
        kTasks);
  bool in_order = true;
  for (size_t i = 0; i < log.order.size(); ++i) in_order = in_order && log.order[i] == int(i);
  CHECK(in_order, "tasks ran out of push order");
  CHECK(log.cancelled.load() == 0, "%d tasks cancelled", log.cancelled.load());
}

// A waiter behind queued tasks runs them all, first to last, on its own thread
// while the worker is held busy; a held queue is not helped.
void runs_the_ones_before() {
  Log log;
  std::atomic<bool> done[5] = {};
  OpQueue q;
  CHECK(q.try_reserve(), "an idle queue could not be reserved");
  for (int i = 0; i < 5; ++i) q.push(task(log, i, done[i]));
  CHECK(!q.help(done[3]), "help() ran tasks while the queue was held");
  CHECK(log.order.empty(), "a held queue ran %zu tasks", log.order.size());
  q.release();
  // The worker may start on them now; whichever thread runs them, in order.
  bool ok = q.help(done[3]);
  if (!ok)
    while (!done[3].load()) std::this_thread::yield();
  while (!done[4].load()) std::this_thread::yield();
  q.stop(true);
  std::lock_guard<std::mutex> g(log.mu);
  CHECK(log.order == std::vector<int>({0, 1, 2, 3, 4}), "order %zu", log.order.size());
}

// After stop(false) the queued tasks are cancelled and help() runs nothing.
void cancelled_after_stop() {
  Log log;
  std::atomic<bool> done[3] = {};
  auto q = std::make_unique<OpQueue>();
  CHECK(q->try_reserve(), "reserve");
  for (int i = 0; i < 3; ++i) q->push(task(log, i, done[i]));
  std::thread stopper([&] { q->stop(false); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  q->release();
  stopper.join();
  CHECK(log.cancelled.load() == 3, "%d of 3 cancelled", log.cancelled.load());
  CHECK(q->help(done[2]), "help() after every task ended was not true");
  q->push(task(log, 9, done[0]));  // stopped: cancelled on the spot
  CHECK(log.cancelled.load() == 4 && log.order.empty(), "a task ran after stop");
}

}  // namespace

int main() {
  many_waiters();
  runs_the_ones_before();
  cancelled_after_stop();
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
