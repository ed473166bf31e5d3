// SPDX-License-Identifier: Apache-2.0
//! @file compress.hpp
//! Umbrella header of the compression piece: codecs, compressed allreduce,
//! bucket manager. Host-compiler safe; device paths are in the .cuh files.
#pragma once

#include <ebbflow/compress/bucket.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/codecs/cast.hpp>
#include <ebbflow/compress/codecs/powersgd.hpp>
#include <ebbflow/compress/codecs/quantize.hpp>
#include <ebbflow/compress/codecs/sign.hpp>
#include <ebbflow/compress/codecs/topk.hpp>
#include <ebbflow/compress/compressed_allreduce.hpp>
