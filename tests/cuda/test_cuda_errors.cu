// GPU tests of concurrency and error reporting: calls from several host threads on several
// streams equal serial calls; CUDA failures reach the caller as megamoe::Error(kCuda), never
// as an abort: synchronously (a device that does not exist), or, for a fault inside the
// kernel (an invalid device pointer), asynchronously at the caller's next synchronization
// and then as the next call's error (the context is lost: those run in child processes).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "stage_harness.h"

namespace {

using namespace harness;

TEST(CudaConcurrency, ThreadsOnStreamsEqualSerialCalls) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<QuantScheme> schemes = all_schemes();
  constexpr int kThreads = 6, kIters = 8;
  std::vector<std::unique_ptr<Staged>> st;
  std::vector<Images> serial;
  for (int i = 0; i < kThreads; ++i) {
    Case c;
    c.T = 97 + 64 * i;
    c.H = 2048;
    c.q = schemes[static_cast<size_t>(i * 2) % schemes.size()];
    c.count = true;
    c.sf_mn_major = i == 3;
    c.misaligned = i == 5;
    st.push_back(std::make_unique<Staged>(c));
    ASSERT_TRUE(st.back()->ok());
    st.back()->fill_inputs(100 + i);
    const Images want = st.back()->expected();
    stage_on_device(*st.back(), {}, false, nullptr);  // serial, legacy stream
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_TRUE(st.back()->check(want)) << c.name();
    Images got;
    for (auto& o : st.back()->outputs()) got.push_back(o.second->download());
    serial.push_back(got);
  }
  // Concurrently: each thread re-poisons its outputs (the counter back to its start) and
  // stages on its own stream, kIters times; the last result must equal the serial one.
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int i = 0; i < kThreads; ++i) {
    pool.emplace_back([&, i] {
      Staged& s = *st[static_cast<size_t>(i)];
      cudaStream_t stream;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        errors[static_cast<size_t>(i)] = "cudaStreamCreate";
        return;
      }
      try {
        for (int it = 0; it < kIters; ++it) {
          for (auto& o : s.outputs()) cudaMemsetAsync(o.second->dev, 0xA5, o.second->host.size(), stream);
          cudaMemcpyAsync(static_cast<uint8_t*>(s.nfb->dev) + s.nf.at(0), &s.counter_start, 8, cudaMemcpyHostToDevice, stream);
          stage_on_device(s, {}, it % 2 == 1, stream);
        }
        if (cudaStreamSynchronize(stream) != cudaSuccess) errors[static_cast<size_t>(i)] = "cudaStreamSynchronize";
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(i)] = e.what();
      }
      cudaStreamDestroy(stream);
    });
  }
  for (auto& t : pool) t.join();
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_EQ(errors[static_cast<size_t>(i)], "") << "thread " << i;
    EXPECT_TRUE(st[static_cast<size_t>(i)]->check(serial[static_cast<size_t>(i)])) << st[static_cast<size_t>(i)]->c.name();
  }
}

TEST(CudaErrors, MissingDeviceIsACudaError) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  Case c;
  c.T = 8;
  c.H = 256;
  Staged s(c);
  ASSERT_TRUE(s.ok());
  s.poison_outputs();
  StageArgs a = s.args(true);
  for (TensorRef* t : {&a.hidden_states, &a.topk_weights, &a.topk_ids, &a.x_q, &a.x_sf, &a.topk_idx_out,
                       &a.topk_weights_out, &*a.is_padding}) {
    t->device = Device::cuda(n);  // one past the last device: never dereferenced
  }
  try {
    megamoe::prepare_inputs(a);
    FAIL() << "no error for device " << n;
  } catch (const megamoe::Error& e) {
    EXPECT_EQ(e.code(), megamoe::ErrorCode::kCuda) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA error"), std::string::npos) << e.what();
  }
  // The failure is not left behind for the caller's next cudaGetLastError.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  for (auto& o : s.outputs()) EXPECT_EQ(o.second->download(), o.second->host) << o.first << " written";
}

TEST(CudaErrors, LaunchRejectsAPlanBeforeTouchingTheDevice) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.T = 8;
  c.H = 256;
  Staged s(c);
  ASSERT_TRUE(s.ok());
  s.poison_outputs();
  const StageArgs a = s.args(true);
  const megamoe::detail::Problem p = megamoe::detail::validate_args(a);
  mc::Plan plan = mc::plan(p, a, mc::device_info(0));
  plan.grid = plan.quant_blocks;  // no top-k blocks for the split-topk shape
  try {
    mc::launch(plan, a, p, nullptr);
    FAIL() << "launched " << mc::to_string(plan);
  } catch (const megamoe::Error& e) {
    EXPECT_EQ(e.code(), megamoe::ErrorCode::kInvalidArgument) << e.what();
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (auto& o : s.outputs()) EXPECT_EQ(o.second->download(), o.second->host) << o.first << " written";
}

// In a child process (the fault loses the CUDA context): stage with an output that is not
// device memory, synchronize, then call again. Exits 0 with "fault reported ..." when the
// fault came back as errors (or when the device could reach the memory, as with HMM).
enum class BadPointer { kHostStack, kFreedDevice };

void fault_scenario(BadPointer kind) {
  Case c;
  c.T = 64;
  c.H = 1024;
  Staged s(c);
  if (!s.ok()) std::exit(2);
  s.fill_inputs(9);
  StageArgs a = s.args(true);
  alignas(16) uint8_t stack_xq[64 * 1024];  // exactly x_q's bytes: a reachable write stays inside
  void* freed = nullptr;
  if (kind == BadPointer::kHostStack) {
    a.x_q.data = stack_xq;
  } else {
    if (cudaMalloc(&freed, sizeof stack_xq) != cudaSuccess || cudaFree(freed) != cudaSuccess) std::exit(2);
    a.x_q.data = freed;
  }
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) std::exit(2);
  try {
    megamoe::prepare_inputs(a, stream);
  } catch (const megamoe::Error& e) {
    std::fprintf(stderr, "fault reported at launch: %s\n", e.what());
    std::exit(e.code() == megamoe::ErrorCode::kCuda ? 0 : 4);
  }
  const cudaError_t sync = cudaStreamSynchronize(stream);
  if (sync == cudaSuccess) {
    std::fprintf(stderr, "fault reported: none, the device reached the memory (HMM / ATS)\n");
    std::exit(0);
  }
  try {
    megamoe::prepare_inputs(s.args(true), stream);
  } catch (const megamoe::Error& e) {
    std::fprintf(stderr, "fault reported: %s at the synchronization, then: %s\n", cudaGetErrorName(sync), e.what());
    std::exit(e.code() == megamoe::ErrorCode::kCuda ? 0 : 5);
  }
  std::fprintf(stderr, "no error from the call after a %s\n", cudaGetErrorName(sync));
  std::exit(3);
}

TEST(CudaErrorsDeathTest, FaultOnHostStackPointerIsReportedNotAborted) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: CUDA does not survive fork
  EXPECT_EXIT(fault_scenario(BadPointer::kHostStack), ::testing::ExitedWithCode(0), "fault reported");
}

TEST(CudaErrorsDeathTest, FaultOnFreedDevicePointerIsReportedNotAborted) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fault_scenario(BadPointer::kFreedDevice), ::testing::ExitedWithCode(0), "fault reported");
}

}  // namespace
