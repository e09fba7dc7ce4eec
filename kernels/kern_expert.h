/* A feed-forward expert block for decentralized mixture-of-experts
 * (Learning@home, seed 002_2b00836ea4b30f79.txt §3.1-3.2, Appendix D):
 *
 *     y (N,C) = x + fc2( gelu( fc1( LN(x) ) ) )      fc1: C -> F, fc2: F -> C
 *
 * An expert server calls forward on a batch of inputs, and backward with
 * the same inputs and dL/dy: backward recomputes the forward (gradient
 * checkpointing, seed 002 §3 "Runtime"), so no activations are kept between
 * requests; it returns dL/dx and accumulates parameter gradients, which the
 * server then applies with a kern_optim step (kern_expert_model gives the
 * optimizer the flat buffers). Inputs and outputs are host memory because
 * they arrive from and go back to the network. */
#ifndef KERN_EXPERT_H
#define KERN_EXPERT_H

#include <stdint.h>

#include "kern_backend.h"
#include "kern_model.h"

struct kern_expert;

/* C model width, F hidden width, max_N largest batch. *out owned. */
int kern_expert_new(const struct kern_backend *be, int C, int F, int max_N, uint64_t seed,
                    struct kern_expert **out);
void kern_expert_free(struct kern_expert *e);

/* y (N,C) from x (N,C); host buffers. CM_EINVAL for N outside 1..max_N or
 * non-finite inputs (a peer's garbage changes nothing). */
int kern_expert_forward(struct kern_expert *e, const float *x, int N, float *y);

/* dx (N,C) = dL/dx given x and dy = dL/dy; grads += dL/dparams. */
int kern_expert_backward(struct kern_expert *e, const float *x, const float *dy, int N, float *dx);

/* The parameter/gradient view (flat buffers, tensor table) for optimizers
 * and checkpoints. Borrowed; its forward/backward entry points are not used
 * (an expert has no loss of its own). */
struct kern_model *kern_expert_model(struct kern_expert *e);

#endif
