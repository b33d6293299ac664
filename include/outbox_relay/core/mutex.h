// A mutex the compiler can reason about: Clang's thread-safety analysis
// (-Wthread-safety, run by scripts/lint's clang-tidy) checks that every
// member marked GUARDED_BY(mu) is touched only with `mu` held, and that a
// function marked REQUIRES(mu) is called with it held, as LevelDB's
// port/thread_annotations.h does. libstdc++'s std::mutex carries no
// annotations, so the analysis needs this wrapper; GCC builds see plain
// std::mutex code (the macros are empty there).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define OUTBOX_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define OUTBOX_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) OUTBOX_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY OUTBOX_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) OUTBOX_THREAD_ANNOTATION(guarded_by(x))
#define REQUIRES(...) OUTBOX_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) OUTBOX_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) OUTBOX_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define EXCLUDES(...) OUTBOX_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

namespace outbox_relay {

class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction (std::lock_guard's part).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable waited on with a Mutex held (LevelDB's
// port::CondVar). Waits name the mutex, so the analysis checks it is held.
// No predicate forms: the analysis cannot see that a lambda runs with the
// lock held, so a caller writes the loop, which it can check:
//   while (queue_.empty()) if (!ready_.WaitUntil(&mu_, deadline)) break;
class CondVar {
 public:
  using Clock = std::chrono::steady_clock;
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Waits until notified (or woken spuriously) or `deadline` passes: false
  // when it passed. `mu` is held again on return. Every wait on one CondVar
  // names the same mutex.
  bool WaitUntil(Mutex* mu, Clock::time_point deadline) REQUIRES(mu) {
    // A deadline already passed (a poll: a timeout of 0) returns at once: the
    // kernel would still sleep its timer slack, about 90 us a call here, which
    // a caller that polls in a loop pays thousands of times.
    if (Clock::now() >= deadline) return false;
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();  // still held: the caller's
    return woken;
  }
  // WaitUntil now + `d`.
  bool WaitFor(Mutex* mu, std::chrono::nanoseconds d) REQUIRES(mu) {
    return WaitUntil(mu, Clock::now() + d);
  }
  // Waits until notified (or woken spuriously).
  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// The stop request of a thread that works in rounds (a watchdog, a sampler, a
// discovery loop): it sleeps between rounds in SleepUntil, and Set() wakes it
// at once. Set once, for good.
class StopLatch {
 public:
  void Set() EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      set_ = true;
    }
    cv_.NotifyAll();
  }
  // Sleeps until `deadline` or Set(): true when set.
  bool SleepUntil(CondVar::Clock::time_point deadline) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!set_) {
      if (!cv_.WaitUntil(&mu_, deadline)) break;
    }
    return set_;
  }
  bool SleepFor(std::chrono::nanoseconds d) { return SleepUntil(CondVar::Clock::now() + d); }

 private:
  Mutex mu_;
  CondVar cv_;
  bool set_ GUARDED_BY(mu_) = false;
};

}  // namespace outbox_relay
