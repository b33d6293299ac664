// ThreadSanitizer builds only (OUTBOX_TSAN): C11 threads, mutexes and condition
// variables routed through their pthread counterparts.
//
// librdkafka (built by scripts/librdkafka as Debian builds it: with C11
// threads, which glibc has) starts its threads with C11 `thrd_create`. glibc
// implements it without going through the `pthread_create` symbol, and GCC 12's
// ThreadSanitizer intercepts only `pthread_create`: a thread librdkafka starts is
// unknown to the sanitizer, and its first allocation through the sanitizer's
// malloc dereferences a thread state that was never set up (SIGSEGV in
// `SizeClassAllocator64LocalCache::Allocate`, first seen in the mock-cluster
// tests, whose broker threads resolve addresses). Defining `thrd_create` in the
// test executable takes the place of glibc's for librdkafka (linked into the
// executable, it resolves to this one), so every thread it
// starts is a thread the sanitizer knows. glibc's `thrd_t` is a `pthread_t` and
// its `thrd_join` reads the thread's return value as an int stored in a
// pointer, which is what the trampoline below returns.
//
// The same holds for C11 `mtx_*` and `cnd_*`: glibc implements them on its
// internal pthread functions, which the sanitizer does not see, so the
// happens-before edge of a record handed to librdkafka on one thread and
// reported back on another (through librdkafka's mutex-guarded queues) was
// invisible and reported as a race on our own memory. glibc's `mtx_t` and
// `cnd_t` have the layout of `pthread_mutex_t` and `pthread_cond_t`.
#include <pthread.h>
#include <threads.h>

#include <cerrno>
#include <cstdint>
#include <ctime>
#include <new>

namespace {

struct Start {
  thrd_start_t fn;
  void* arg;
};

void* Trampoline(void* raw) {
  Start start = *static_cast<Start*>(raw);
  delete static_cast<Start*>(raw);
  return reinterpret_cast<void*>(static_cast<intptr_t>(start.fn(start.arg)));
}

}  // namespace

extern "C" int thrd_create(thrd_t* thread, thrd_start_t fn, void* arg) {
  auto* start = new (std::nothrow) Start{fn, arg};
  if (start == nullptr) return thrd_nomem;
  pthread_t id;
  const int rc = pthread_create(&id, nullptr, Trampoline, start);
  if (rc != 0) {
    delete start;
    return rc == EAGAIN ? thrd_nomem : thrd_error;
  }
  *thread = id;
  return thrd_success;
}

extern "C" int thrd_join(thrd_t thread, int* result) {
  void* value = nullptr;
  const int rc = pthread_join(thread, &value);
  if (rc != 0) return thrd_error;
  if (result != nullptr) *result = static_cast<int>(reinterpret_cast<intptr_t>(value));
  return thrd_success;
}

extern "C" int thrd_detach(thrd_t thread) {
  return pthread_detach(thread) == 0 ? thrd_success : thrd_error;
}

namespace {

pthread_mutex_t* M(mtx_t* m) { return reinterpret_cast<pthread_mutex_t*>(m); }
pthread_cond_t* C(cnd_t* c) { return reinterpret_cast<pthread_cond_t*>(c); }
int Thrd(int rc) {
  if (rc == 0) return thrd_success;
  if (rc == ETIMEDOUT) return thrd_timedout;
  if (rc == EBUSY) return thrd_busy;
  if (rc == ENOMEM) return thrd_nomem;
  return thrd_error;
}

}  // namespace

static_assert(sizeof(mtx_t) == sizeof(pthread_mutex_t));
static_assert(sizeof(cnd_t) == sizeof(pthread_cond_t));

extern "C" int mtx_init(mtx_t* m, int type) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  if ((type & mtx_recursive) != 0) pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  const int rc = pthread_mutex_init(M(m), &attr);
  pthread_mutexattr_destroy(&attr);
  return Thrd(rc);
}
extern "C" int mtx_lock(mtx_t* m) { return Thrd(pthread_mutex_lock(M(m))); }
extern "C" int mtx_trylock(mtx_t* m) { return Thrd(pthread_mutex_trylock(M(m))); }
extern "C" int mtx_timedlock(mtx_t* __restrict m, const struct timespec* __restrict t) {
  return Thrd(pthread_mutex_timedlock(M(m), t));
}
extern "C" int mtx_unlock(mtx_t* m) { return Thrd(pthread_mutex_unlock(M(m))); }
extern "C" void mtx_destroy(mtx_t* m) { pthread_mutex_destroy(M(m)); }

extern "C" int cnd_init(cnd_t* c) { return Thrd(pthread_cond_init(C(c), nullptr)); }
extern "C" int cnd_signal(cnd_t* c) { return Thrd(pthread_cond_signal(C(c))); }
extern "C" int cnd_broadcast(cnd_t* c) { return Thrd(pthread_cond_broadcast(C(c))); }
extern "C" int cnd_wait(cnd_t* c, mtx_t* m) { return Thrd(pthread_cond_wait(C(c), M(m))); }
extern "C" int cnd_timedwait(cnd_t* __restrict c, mtx_t* __restrict m,
                             const struct timespec* __restrict t) {
  return Thrd(pthread_cond_timedwait(C(c), M(m), t));
}
extern "C" void cnd_destroy(cnd_t* c) { pthread_cond_destroy(C(c)); }
