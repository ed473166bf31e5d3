// SPDX-License-Identifier: Apache-2.0
// Compiled against a single header amalgamated from the real headers plus the
// fixture headers, once with every backend and once with none: each fixture
// piece must be present exactly when its backends are.
#include <ebbflow/ebbflow.hpp>

#include <cstdio>

// A guarded piece is there exactly when its backends are.
#if defined(FIXTURE_UCX_PRESENT) != EBBFLOW_HAS_UCX
#error "fixture_transport.hpp (UCX) present/absent against EBBFLOW_HAS_UCX"
#endif
#if defined(FIXTURE_STORE_PRESENT) != EBBFLOW_HAS_ASIO
#error "fixture_store.hpp (Asio) present/absent against EBBFLOW_HAS_ASIO"
#endif
#if defined(FIXTURE_BRIDGE_PRESENT) != (EBBFLOW_HAS_ASIO && EBBFLOW_HAS_UCX)
#error "ucx_fixture_bridge.hpp present/absent against EBBFLOW_HAS_ASIO && EBBFLOW_HAS_UCX"
#endif

int main() {
  int expect = 2, got = fixture::plan_value();
#if EBBFLOW_HAS_UCX
  expect += 100;
#endif
#if EBBFLOW_HAS_ASIO
  expect += 12;
  got += fixture::store{}.value();
#endif
#if EBBFLOW_HAS_ASIO && EBBFLOW_HAS_UCX
  expect += 13;
  got += fixture::bridge_value();
#endif
  std::printf("amalgamate fixture: asio=%d ucx=%d got=%d expected=%d\n", EBBFLOW_HAS_ASIO, EBBFLOW_HAS_UCX, got,
              expect);
  return got == expect ? 0 : 1;
}
