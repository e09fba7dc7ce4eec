#!/usr/bin/python3
"""PyTorch gloo side of tests/bench/bench_allreduce_gloo.c (make bench).

Times torch.distributed.all_reduce (backend gloo, SUM) of FLOATS fp32 values
among WORLD processes on loopback, on the same data as our engine: rank p's
gradient is the hash of bench_allreduce_gloo.c's grad(p, i), pre-scaled by
w_p / W (the sample-count weights 16 + 8p), so the sum is the weighted
average our engine computes. One warm-up round, then REPS rounds; a round's
time is the slowest rank's, measured after a barrier. Every rank's output of
every round is compared with the expected values written by the C driver
(exact average in double, rounded to fp32).

With --rank R --master IP --port P it runs rank R alone (the C driver starts
one per network-namespace host, GLOO_SOCKET_IFNAME naming the host's
interface; rank 0 holds the rendezvous at IP:P and prints the result).

Prints one line `gloo median_ms=M max_err=E cpu_ms=C sys_ms=S` (C: user +
system CPU of all ranks, S: its system part; or `gloo skip: why`); exits
non-zero when a result is wrong.

Debian's python3-torch belongs to /usr/bin/python3 (scripts/install-deps.sh
--torch installs it).
"""
import argparse
import os
import resource
import socket
import sys
import time

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError as e:  # reported, the C side prints it as a skip
    print("gloo skip: %s (install with scripts/install-deps.sh --torch)" % e)
    sys.exit(0)

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def grad(p, n, block=1 << 20):
    """grad(p, i) for i in [0, n), bit-identical to the C function."""
    out = np.empty(n, dtype=np.float32)
    k2 = np.uint64(((p + 1) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        for s in range(0, n, block):
            x = np.arange(s, min(n, s + block), dtype=np.uint64)
            x = x * np.uint64(0x9E3779B97F4A7C15)
            x ^= k2
            x ^= x >> np.uint64(31)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(29)
            out[s:s + len(x)] = ((x >> np.uint64(40)).astype(np.float64) / 8388608.0 - 1.0)
    return out


def weight(p):
    return 16.0 + 8.0 * p


def cpu_s():
    """(user + system, system) CPU seconds of this rank, all its threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_stime


def rank_main(rank, world, n, reps, port, expected_path, q, master="127.0.0.1"):
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (master, port), rank=rank,
                            world_size=world)
    W = sum(weight(p) for p in range(world))
    g0 = torch.from_numpy(grad(rank, n) * np.float32(weight(rank) / W))
    expected = torch.from_numpy(np.fromfile(expected_path, dtype=np.float32, count=n))
    t = torch.empty_like(g0)
    times, cpus, syss, worst = [], [], [], 0.0
    for r in range(reps + 1):
        t.copy_(g0)
        dist.barrier()
        t0 = time.perf_counter()
        c0 = cpu_s()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        c1 = cpu_s()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        # CPU time of this rank (all its threads, gloo's included) and its
        # system part, summed over the ranks
        cpu = torch.tensor([c1[0] - c0[0], c1[1] - c0[1]], dtype=torch.float64)
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
        err = (t - expected).abs().max().item()
        if not err <= worst:
            worst = err
        if r > 0:
            times.append(dt.item() * 1000)
            cpus.append(cpu[0].item() * 1000)
            syss.append(cpu[1].item() * 1000)
    e = torch.tensor([worst], dtype=torch.float64)
    dist.all_reduce(e, op=dist.ReduceOp.MAX)
    dist.destroy_process_group()
    if rank == 0:
        q.put((times, cpus, syss, e.item()))


class _Box:
    """q.put of rank_main when the rank runs alone (--rank)."""
    item = None

    def put(self, x):
        self.item = x


def report(times, cpus, syss, err, tol):
    times.sort()
    m = len(times)
    med = times[m // 2] if m % 2 else (times[m // 2 - 1] + times[m // 2]) / 2
    cpus.sort()
    cmed = cpus[m // 2] if m % 2 else (cpus[m // 2 - 1] + cpus[m // 2]) / 2
    syss.sort()
    smed = syss[m // 2] if m % 2 else (syss[m // 2 - 1] + syss[m // 2]) / 2
    print("gloo rounds_ms=%s cpu_ms=%s" % (",".join("%.0f" % x for x in times),
                                          ",".join("%.0f" % x for x in cpus)))
    print("gloo median_ms=%.1f max_err=%.3g cpu_ms=%.1f sys_ms=%.1f" % (med, err, cmed, smed))
    if not err <= tol:
        print("gloo: result differs from the exact average by %.3g (> %.3g)" % (err, tol))
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--floats", type=int, required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--expected", required=True)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--rank", type=int, default=-1,
                    help="run this one rank (on a host of its own); rank 0 prints the result")
    ap.add_argument("--master", default="127.0.0.1", help="rank 0's address (with --rank)")
    ap.add_argument("--port", type=int, default=0, help="rendezvous port at --master (with --rank)")
    a = ap.parse_args()
    if not dist.is_available() or not dist.is_gloo_available():
        print("gloo skip: torch.distributed without gloo")
        return 0
    if a.rank >= 0:
        box = _Box()
        rank_main(a.rank, a.world, a.floats, a.reps, a.port, a.expected, box, a.master)
        return report(*box.item, a.tol) if a.rank == 0 else 0
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main,
                         args=(r, a.world, a.floats, a.reps, port, a.expected, q))
             for r in range(a.world)]
    for p in procs:
        p.start()
    times, cpus, syss, err = q.get(timeout=600)
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        print("gloo: a rank failed")
        return 1
    return report(times, cpus, syss, err, a.tol)


if __name__ == "__main__":
    sys.exit(main())
