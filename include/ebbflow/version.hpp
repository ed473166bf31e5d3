// SPDX-License-Identifier: Apache-2.0
//! @file version.hpp
//! The one source of truth for the ebbflow version (read by CMake, packaging recipes).
#pragma once

//! Major version: incompatible API changes.
#define EBBFLOW_VERSION_MAJOR 0
//! Minor version: compatible additions.
#define EBBFLOW_VERSION_MINOR 1
//! Patch version: fixes.
#define EBBFLOW_VERSION_PATCH 0
//! Encoded as MAJOR * 10000 + MINOR * 100 + PATCH.
#define EBBFLOW_VERSION (EBBFLOW_VERSION_MAJOR * 10000 + EBBFLOW_VERSION_MINOR * 100 + EBBFLOW_VERSION_PATCH)
//! "MAJOR.MINOR.PATCH".
#define EBBFLOW_VERSION_STRING "0.1.0"
