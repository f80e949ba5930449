#pragma once
// CPU-only ways to make a CPU Backend (backend/backend.h) beyond
// make_cpu_backend(n_threads): on a thread pool the caller shares with
// other CPU code, and as a decode lane of another CPU Backend.
#include <memory>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace rill {

// A CPU Backend whose ops run on `pool` (not owned: it must outlive the
// Backend), so a CPU runtime keeps one set of worker threads (its
// CpuPagedModel's cpu::HostOps pool).
std::unique_ptr<Backend> make_cpu_backend_on(ThreadPool& pool);

// A decode lane: a CPU Backend on n_threads threads of its own that reads
// what `parent` (a CPU Backend) placed. Weights, vectors and RoPE tables
// placed on the parent, before or after, are valid on the lane, and the
// lane's reserve() sizes its scratch for them; the lane must not outlive
// the parent's host data.
std::unique_ptr<Backend> make_cpu_lane(const Backend& parent, int n_threads);

}  // namespace rill
