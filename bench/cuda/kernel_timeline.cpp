// A CUPTI activity trace of a CUDA program, for a timeline where nsys is
// missing (the H200 machines here): built as a shared library and loaded by
// the driver through CUDA_INJECTION64_PATH, it records every kernel,
// memcpy, memset and runtime / driver API call with its device or host
// timestamps (one clock), and writes them as CSV to $RILL_TIMELINE at exit:
//   kind,name,start_ns,end_ns,correlation,extra
// (kernels: extra = grid x*y*z; copies and memsets: bytes). The program's
// cudaProfilerStart / cudaProfilerStop calls appear as runtime rows, so a
// window can be cut out afterwards (bench/cuda/timeline_report.py).
// Build: g++ -O2 -shared -fPIC kernel_timeline.cpp -I$CUDA/include
//        -L$CUDA/lib -lcupti -o libkernel_timeline.so
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;
std::mutex g_mu;
std::vector<std::string> g_rows;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

const char* api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name) return "?";
  return name;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  char line[1024];
  std::vector<std::string> rows;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        std::snprintf(line, sizeof line, "kernel,%s,%llu,%llu,%u,%d", k->name ? k->name : "?",
                      static_cast<unsigned long long>(k->start), static_cast<unsigned long long>(k->end),
                      k->correlationId, k->gridX * k->gridY * k->gridZ);
        rows.emplace_back(line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        std::snprintf(line, sizeof line, "memcpy,kind%d,%llu,%llu,%u,%llu", static_cast<int>(m->copyKind),
                      static_cast<unsigned long long>(m->start), static_cast<unsigned long long>(m->end),
                      m->correlationId, static_cast<unsigned long long>(m->bytes));
        rows.emplace_back(line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        std::snprintf(line, sizeof line, "memset,memset,%llu,%llu,%u,%llu", static_cast<unsigned long long>(m->start),
                      static_cast<unsigned long long>(m->end), m->correlationId,
                      static_cast<unsigned long long>(m->bytes));
        rows.emplace_back(line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        const bool rt = rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
        std::snprintf(line, sizeof line, "%s,%s,%llu,%llu,%u,0", rt ? "runtime" : "driver",
                      api_name(rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a->cbid),
                      static_cast<unsigned long long>(a->start), static_cast<unsigned long long>(a->end),
                      a->correlationId);
        rows.emplace_back(line);
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& r : rows) g_rows.push_back(std::move(r));
}

void write_out() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("RILL_TIMELINE");
  FILE* f = std::fopen(path ? path : "timeline.csv", "w");
  if (!f) return;
  std::fprintf(f, "kind,name,start_ns,end_ns,correlation,extra\n");
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& r : g_rows) std::fprintf(f, "%s\n", r.c_str());
  std::fclose(f);
  std::fprintf(stderr, "kernel_timeline: %zu rows to %s\n", g_rows.size(), path ? path : "timeline.csv");
}

}  // namespace

extern "C" int InitializeInjection(void) {
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                               CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER}) {
    if (cuptiActivityEnable(k) != CUPTI_SUCCESS) std::fprintf(stderr, "kernel_timeline: activity %d refused\n", k);
  }
  std::atexit(write_out);
  return 1;
}
