// The native driver: the tables native_loop.py packs (laid out as its ctypes structures: change
// both together) and the loop that runs a traced step's launches step after step on a ring of
// buffers. Two libraries include it: loop.cpp (native_loop.py's runs of steps) and sweep.cpp
// (native_sweep.py's stretches of a reverse sweep). Everything here is `static`: each library
// exports its own entry points only. Built by compiler/backends/cpu_build.py like every kernel.
#pragma once
#include <cstdint>
#include <cstring>
typedef void (*forward_t)(const char*, int);
struct sp_launch { forward_t entry; char* buf; int64_t serial; };
struct sp_patch { int64_t launch; int64_t offset; int64_t slot; };   // buf + offset <- slots[slot]
struct sp_state { int64_t prev; int64_t next; void* spare; };        // slot indices, the second new version
struct sp_zero { int64_t slot; int64_t nbytes; };
struct sp_series { int64_t slot; const char* base; int64_t stride; };   // row n at base + n * stride
struct sp_time {                                                     // what moves with the step index
    const sp_series* series; int64_t n_series;
    int64_t n;                                                       // the index of the next step run
    int64_t loss_slot; int64_t loss_size; double* losses;            // each step's running loss, or null
};
struct sp_rename { int64_t to; int64_t from; int64_t in_place; };     // state indices: next.to = prev.from;
                                                                     // in_place: next.from may be prev.to's buffer
struct sp_renames {                                                  // copies of a state done by renaming
    const sp_rename* pairs; int64_t n_pairs;
    const int64_t* copies; const forward_t* instead; int64_t n_copies;  // the launches that copy, and what
                                                                     // runs instead but on the last step
                                                                     // (nothing, or the kernel without
                                                                     // its copying stores)
    int64_t n_zeros;                                                 // the zero fills before the renamed ones
    void** saved;                                                    // 3 x n_pairs pointers of room
};

static const sp_launch* sp_renamed(const sp_renames* r, const sp_launch& launch, int64_t l, sp_launch* instead) {
    for (int64_t c = 0; c < r->n_copies; ++c)
        if (r->copies[c] == l) {
            if (r->instead[c] == nullptr) return nullptr;
            *instead = launch;
            instead->entry = r->instead[c];
            return instead;
        }
    return &launch;
}

// One step on the buffers in slots[]: the series rows of step t->n in their slots, the pointers
// patched into the launches, the zero fills, the launches, the running loss read out (where
// t->losses); with `r`, its whole-state copies renamed (a copy launch skipped, a copying kernel run
// without its copying stores, the renamed states' s.next not zero-filled).
static void sp_step(const sp_launch* launches, int64_t n_launches, const sp_patch* patches, int64_t n_patches,
                    void** slots, const sp_zero* zeros, int64_t n_zeros, const sp_renames* r, sp_time* t) {
    if (t != nullptr)
        for (int64_t q = 0; q < t->n_series; ++q)
            slots[t->series[q].slot] = (void*)(t->series[q].base + t->n * t->series[q].stride);
    for (int64_t p = 0; p < n_patches; ++p)
        std::memcpy(launches[patches[p].launch].buf + patches[p].offset, &slots[patches[p].slot], sizeof(void*));
    for (int64_t z = 0; z < (r != nullptr ? r->n_zeros : n_zeros); ++z)
        std::memset(slots[zeros[z].slot], 0, (size_t)zeros[z].nbytes);
    for (int64_t l = 0; l < n_launches; ++l) {
        sp_launch instead;
        const sp_launch* run = r != nullptr ? sp_renamed(r, launches[l], l, &instead) : &launches[l];
        if (run != nullptr) run->entry(run->buf, (int)run->serial);
    }
    if (t == nullptr) return;
    if (t->losses != nullptr) {
        const void* loss = slots[t->loss_slot];
        *t->losses++ = t->loss_size == 4 ? (double)*(const float*)loss : *(const double*)loss;
    }
    ++t->n;
}

// Runs `steps` steps. slots[] holds the buffers of the first step; after step k each state's prev
// slot takes what its next slot held, and its next slot the buffer that is free again (the spare
// after the first step: the starting state is never written). On return the prev slots hold the
// last step's result and the next slots the other version.
//
// With `r`, a run of two steps or more skips the copies next.to = prev.from (a copy launch, or the
// stores of a kernel that copies as it goes: it runs without them): next step's prev.to is this
// step's prev.from buffer itself. `from` then turns over three buffers (the one `to` reads,
// the one it reads, the one it writes): the one `to` read becomes free, except after the first
// two steps, where that is a starting buffer (to's, then from's) and the spares stand in for them.
// The last step's prev.from was written by the run, so the result's `to` is that buffer and owns
// it; a run of one step copies (its prev.from is the caller's starting buffer).
// Where the pair is `in_place` (the step reads prev.to only where it then writes next.from, each
// thread at its own elements before it writes them: native_loop.py `in_place_renames`), `from`
// turns over two buffers from the second step on: next.from is the buffer `to` reads, which this
// run wrote (the first step's `to` reads a starting buffer: it keeps the three-buffer turn).
static void sp_run(int64_t steps, const sp_launch* launches, int64_t n_launches,
                   const sp_patch* patches, int64_t n_patches, void** slots,
                   const sp_state* states, int64_t n_states, const sp_zero* zeros, int64_t n_zeros,
                   const sp_renames* r, sp_time* t) {
    for (int64_t k = 0; k < steps; ++k) {
        const bool renaming = r != nullptr && steps > 1;
        sp_step(launches, n_launches, patches, n_patches, slots, zeros, n_zeros, renaming ? r : nullptr, t);
        if (renaming)
            for (int64_t q = 0; q < r->n_pairs; ++q) {
                const sp_state& to = states[r->pairs[q].to];
                const sp_state& from = states[r->pairs[q].from];
                r->saved[3 * q] = slots[to.prev];
                r->saved[3 * q + 1] = slots[to.next];
                r->saved[3 * q + 2] = slots[from.prev];
            }
        for (int64_t s = 0; s < n_states; ++s) {
            void* old = slots[states[s].prev];
            slots[states[s].prev] = slots[states[s].next];
            slots[states[s].next] = k == 0 ? states[s].spare : old;
        }
        if (renaming)
            for (int64_t q = 0; q < r->n_pairs; ++q) {
                const sp_state& to = states[r->pairs[q].to];
                const sp_state& from = states[r->pairs[q].from];
                void* freed = r->saved[3 * q];                           // what `to` read this step
                slots[to.prev] = r->saved[3 * q + 2];
                slots[to.next] = r->saved[3 * q + 1];
                slots[from.next] = k == 0 ? to.spare : r->pairs[q].in_place ? slots[to.prev]
                                 : k == 1 ? from.spare : freed;
            }
    }
}
