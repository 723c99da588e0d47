// A small CUDA C++ program with the usual error-checking macro, run to make real logs (see run_all.sh).
//   ./cudaprog oom      -- cudaMalloc of 400 GiB
//   ./cudaprog illegal  -- a kernel writes through a null pointer
//   ./cudaprog throw    -- a std::runtime_error nobody catches (after a good kernel)
//   ./cudaprog segv     -- a host null-pointer write
//   ./cudaprog done     -- a vector add over 1<<24 elements, checked
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      fprintf(stderr, "CUDA error: %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, __LINE__); \
      exit(EXIT_FAILURE);                                                                \
    }                                                                                    \
  } while (0)

__global__ void add(const float* a, const float* b, float* c, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "done";
  size_t n = 1 << 24;
  float *a, *b, *c;
  printf("cudaprog %s: allocating 3 x %zu floats\n", mode, n);
  fflush(stdout);
  if (!strcmp(mode, "oom")) {
    void* big;
    CHECK(cudaMalloc(&big, (size_t)400 << 30));
  }
  CHECK(cudaMalloc(&a, n * sizeof(float)));
  CHECK(cudaMalloc(&b, n * sizeof(float)));
  CHECK(cudaMalloc(&c, n * sizeof(float)));
  std::vector<float> h(n, 1.0f);
  CHECK(cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  for (int iter = 1; iter <= 5; ++iter) {
    add<<<(n + 255) / 256, 256>>>(a, b, !strcmp(mode, "illegal") && iter == 3 ? nullptr : c, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    printf("iter %d/5 ok\n", iter);
    fflush(stdout);
  }
  CHECK(cudaMemcpy(h.data(), c, n * sizeof(float), cudaMemcpyDeviceToHost));
  if (!strcmp(mode, "throw")) throw std::runtime_error("result check failed: expected 2.0, got " + std::to_string(h[0] + 1));
  if (!strcmp(mode, "segv")) { int* p = nullptr; *p = 1; }
  printf("all %zu sums are %.1f\n", n, h[n - 1]);
  return 0;
}
