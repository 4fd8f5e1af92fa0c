// memcpy with non-temporal (streaming) stores, for staging another core reads.
//
// A staged collective writes a staging half that a peer then reads, and
// writes it again two steps later. With ordinary stores every line is first
// fetched into this core's cache (read for ownership, taking it from the peer
// that read it last) and then fetched by the peer from this core's cache.
// Between cores that share a last-level cache both trips are cheap; between
// cores that do not (transport/shm/adaptation.h) each one crosses the
// chip's fabric and the copies run at a fraction of memory bandwidth.
// Streaming stores write the lines to memory without fetching them, and the
// peer reads them from memory: two memory trips instead of two fabric trips.
// The copy ends with a store fence, so a flag published after it is ordered
// after the data (streaming stores are weakly ordered).
#pragma once

#include <cstddef>

namespace rsdp {

void stream_copy(void* dst, const void* src, size_t bytes);

}  // namespace rsdp
