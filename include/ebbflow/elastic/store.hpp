// SPDX-License-Identifier: Apache-2.0
//! @file store.hpp
//! Renamed elastic/tcp_store.hpp (the TCP rendezvous store's server and
//! client); this compatibility include goes in the next release.
#pragma once

#include <ebbflow/elastic/tcp_store.hpp>
