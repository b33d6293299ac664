// A mutex the compiler can reason about: Clang's thread-safety analysis
// (-Wthread-safety, run by scripts/lint's clang-tidy) checks that every
// member marked GUARDED_BY(mu) is touched only with `mu` held, and that a
// function marked REQUIRES(mu) is called with it held, as LevelDB's
// port/thread_annotations.h does. libstdc++'s std::mutex carries no
// annotations, so the analysis needs this wrapper; GCC builds see plain
// std::mutex code (the macros are empty there).
#pragma once

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

}  // namespace outbox_relay
