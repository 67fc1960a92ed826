// libnvfs-direct as LD_PRELOAD (preload.cpp): pread and its kin served for
// nvfs files of unmodified programs, and the calls that free or reuse a
// descriptor number watched so that a number never reads another file's
// bytes.
#pragma once

namespace nvfs::direct {

// Run by the library's constructor: the preload serves reads only when the
// library was loaded through LD_PRELOAD (its file named there); linked or
// dlopen'ed, every interposed call goes straight to libc.
void PreloadInit();

}  // namespace nvfs::direct
