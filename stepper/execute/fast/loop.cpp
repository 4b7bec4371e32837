// native_loop.py's library: runs of a traced step's launches (the ring: sp_run in driver.h).
#include "driver.h"

// Runs `steps` steps on the ring (sp_run).
extern "C" void sp_advance(int64_t steps, const sp_launch* launches, int64_t n_launches,
                           const sp_patch* patches, int64_t n_patches, void** slots,
                           const sp_state* states, int64_t n_states, const sp_zero* zeros, int64_t n_zeros,
                           const sp_renames* r, sp_time* t) {
    sp_run(steps, launches, n_launches, patches, n_patches, slots, states, n_states, zeros, n_zeros, r, t);
}

// Runs `steps` steps, step k from versions[k] into versions[k + 1] (n_states buffers each, in state
// order): steps that each keep their result (records kept for the reverse sweep). With `r`, every
// step skips its whole-state copies: the caller made versions[k + 1]'s `to` versions[k]'s `from`.
extern "C" void sp_advance_each(int64_t steps, const sp_launch* launches, int64_t n_launches,
                                const sp_patch* patches, int64_t n_patches, void** slots,
                                const sp_state* states, int64_t n_states, const sp_zero* zeros, int64_t n_zeros,
                                void* const* versions, const sp_renames* r, sp_time* t) {
    for (int64_t k = 0; k < steps; ++k) {
        for (int64_t s = 0; s < n_states; ++s) {
            slots[states[s].prev] = versions[k * n_states + s];
            slots[states[s].next] = versions[(k + 1) * n_states + s];
        }
        sp_step(launches, n_launches, patches, n_patches, slots, zeros, n_zeros, r, t);
    }
}
