/* Helpers shared by the model files in kernels/ (not a public header):
 * building the named-tensor table of a flat parameter buffer, and the
 * allocation of parameter and gradient slabs. */
#ifndef KERN_INTERNAL_H
#define KERN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kern_model.h"

struct kern__tensor_list {
    struct kern_tensor *v;
    int n, cap;
    size_t total; /* floats so far */
};

/* Appends a tensor of the given shape (ndim <= 4) at the current end of the
 * flat buffer; returns its offset in *off. CM_ENOMEM on failure. */
int kern__tensor_add(struct kern__tensor_list *l, const char *name, int decay, size_t *off,
                     int ndim, int d0, int d1, int d2, int d3);

/* Allocates params and grads (zeroed) of l->total floats on m->be and moves
 * the table into m. */
int kern__model_alloc(struct kern_model *m, struct kern__tensor_list *l);

/* Fills host buffer x (n) with N(0, std) or U(-a, a). */
void kern__init_normal(float *x, size_t n, float std, uint64_t *rng);
/* Advances rng past n draws of kern_rng_u64 (each kern_rng_uniform is one,
 * each kern_rng_normal two), as if they had been made. */
void kern__rng_skip(uint64_t *rng, uint64_t n);
void kern__init_uniform(float *x, size_t n, float a, uint64_t *rng);

/* Allocates n floats (or ints) on the backend, adding to *err on failure so a
 * model can allocate many buffers and check once. */
float *kern__alloc_f(const struct kern_backend *be, size_t n, int *err);
int *kern__alloc_i(const struct kern_backend *be, size_t n, int *err);

/* Host-side scoring shared by the models: adds the losses (N, device) of the
 * rows with target >= 0 and, when probs is given, counts argmax hits. */
int kern__score(const struct kern_backend *be, const float *losses_dev, const float *probs_dev,
                const int *targets_host, int N, int V, struct kern_eval *ev);

#endif
