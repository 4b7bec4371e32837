// native_sweep.py's library: a stretch of a reverse sweep as one table of operations, run by one
// call (the operations are listed in native_sweep.py's docstring; the advances are driver.h's ring).
#include "driver.h"

typedef int (*adjoint_t)(const char*, const char*, void*, int64_t, int, void*, int);
struct sp_rpatch { char* buf; int64_t offset; int64_t slot; };      // buf + offset <- rslots[slot]
struct sp_rcall { void* entry; const char* fwd; const char* adj; int64_t serial; int64_t zero_begin; int64_t zero_end; };
struct sp_fill { int64_t slot; int64_t nbytes; };
struct sp_plan {
    int64_t S, F;                                      // states, float states
    const sp_launch* launches; int64_t n_launches;     // the advance (native_loop's tables)
    const sp_patch* patches; int64_t n_patches;
    void** slots; sp_state* states; const sp_zero* zeros; int64_t n_zeros;
    const sp_launch* rforward; int64_t n_rforward;     // the reversal (native_reverse's plan)
    const sp_rpatch* rpatches; int64_t n_rpatches;
    const sp_fill* before; int64_t n_before;           // zero fills of s.next and scratch, as taken
    int64_t seed_slot; int64_t seed_size;              // the running loss's gradient, or -1
    const sp_rcall* calls; int64_t n_calls;
    const sp_fill* fills; int64_t after_begin; int64_t after_end;
    void** rslots;                                     // prev[S] next[S] gprev[F] carry[F] scratch.. series..
    const sp_renames* renames;                         // the advance's renamed copies, or null
    sp_time* time;                                     // the advance's series rows (no losses)
    const sp_series* rseries; int64_t n_rseries;       // the reversal's
};

// ops: 0, steps, n, start[S], a[S], b[S]  |  1, n, prev[S], next[S], gprev[F], carry[F]
//      |  2, n, prev[S], next[S]  |  4: 0's with its copies renamed   (n: the index of the (first) step)
//      |  3, count, (float32 gradient, float64 sum, elements) x count
extern "C" void sp_sweep(const int64_t* ops, int64_t n_words, const sp_plan* p) {
    const int64_t S = p->S, F = p->F;
    int64_t i = 0;
    while (i < n_words) {
        const int64_t op = ops[i++];
        if (op == 3) {                                 // stepper/execute/param_sums.py's fold, after the steps it is due
            const int64_t count = ops[i++];
            for (int64_t q = 0; q < count; ++q, i += 3) {
                float* g = (float*)ops[i];
                double* sum = (double*)ops[i + 1];
                for (int64_t e = 0; e < ops[i + 2]; ++e) { sum[e] = sum[e] + (double)g[e]; g[e] = 0.0f; }
            }
            continue;
        }
        const int64_t n = ops[i++];
        if (op == 2) {
            for (int64_t s = 0; s < 2 * S; ++s) p->slots[s] = (void*)ops[i + s];
            i += 2 * S;
            p->time->n = n;
            sp_step(p->launches, p->n_launches, p->patches, p->n_patches, p->slots, p->zeros, p->n_zeros,
                    p->renames, p->time);              // one step, its copies renamed
            continue;
        }
        if (op == 0 || op == 4) {
            const int64_t steps = ops[i++];
            for (int64_t s = 0; s < S; ++s) {
                p->slots[s] = (void*)ops[i + s];
                p->slots[S + s] = (void*)ops[i + S + s];
                p->states[s].spare = (void*)ops[i + 2 * S + s];
            }
            i += 3 * S;
            p->time->n = n;
            sp_run(steps, p->launches, p->n_launches, p->patches, p->n_patches, p->slots, p->states, S,
                   p->zeros, p->n_zeros, op == 4 ? p->renames : nullptr, p->time);
            continue;
        }
        for (int64_t k = 0; k < 2 * S + 2 * F; ++k) p->rslots[k] = (void*)ops[i + k];
        i += 2 * S + 2 * F;
        for (int64_t q = 0; q < p->n_rseries; ++q)
            p->rslots[p->rseries[q].slot] = (void*)(p->rseries[q].base + n * p->rseries[q].stride);
        for (int64_t q = 0; q < p->n_rpatches; ++q)
            std::memcpy(p->rpatches[q].buf + p->rpatches[q].offset, &p->rslots[p->rpatches[q].slot], sizeof(void*));
        for (int64_t z = 0; z < p->n_before; ++z)
            std::memset(p->rslots[p->before[z].slot], 0, (size_t)p->before[z].nbytes);
        for (int64_t l = 0; l < p->n_rforward; ++l)
            p->rforward[l].entry(p->rforward[l].buf, (int)p->rforward[l].serial);
        if (p->seed_slot >= 0) {
            if (p->seed_size == 4) *(float*)p->rslots[p->seed_slot] = 1.0f;
            else *(double*)p->rslots[p->seed_slot] = 1.0;
        }
        for (int64_t c = 0; c < p->n_calls; ++c) {
            const sp_rcall& call = p->calls[c];
            for (int64_t z = call.zero_begin; z < call.zero_end; ++z)
                std::memset(p->rslots[p->fills[z].slot], 0, (size_t)p->fills[z].nbytes);
            ((adjoint_t)call.entry)(call.fwd, call.adj, nullptr, 0, 0, nullptr, (int)call.serial);
        }
        for (int64_t z = p->after_begin; z < p->after_end; ++z)
            std::memset(p->rslots[p->fills[z].slot], 0, (size_t)p->fills[z].nbytes);
    }
}
