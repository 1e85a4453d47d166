/* client.h: psbench's client role: one libps worker process driven by psbench over its stdin
 * and stdout (psbench runs itself with --client).
 *
 * Protocol, one line each way (the client writes nothing else to stdout):
 *   client: "ready RANK lanes: shard 0 over LANES[ + direct ...]; shard 1 over ..."
 *                                             connected, every tensor declared
 *   psbench: "case OP SIZE WARM"              OP: push | pull | round
 *   client: "warm MEAN_NS"                    after WARM untimed iterations (MEAN_NS: the
 *                                             mean of their second half)
 *   psbench: "run ITERS"
 *   client: "lat NS NS ..." (up to 500 per line), then "res T0_NS T1_NS N"
 *            T0/T1: CLOCK_MONOTONIC around the timed loop, comparable across processes
 *   psbench: "quit"                           the client leaves and exits 0
 *   client: "error TEXT" then exits 1, whenever an operation fails.
 *
 * Ops, on the tensor "psbench.SIZE" (SIZE bytes of fp32):
 *   push   push(step s) and wait: under bsp the ack comes once every worker pushed step s and
 *          the step is committed; under asp each push is applied on arrival (s is ignored);
 *   pull   pull(min_version 0) and wait;
 *   round  push(step s) and pull(min_version s + 1) issued together, then wait for both: the
 *          BSP step (the push is acknowledged after the step is committed, the pull waits for
 *          it).
 * s starts at the tensor's version, learnt by a pull(min_version 0) when a case begins. */
#ifndef PB_CLIENT_H
#define PB_CLIENT_H

/* The training-set size a client gives the coordinator when it joins the step (it pushes steps
 * on its own and takes no batch). A cluster whose job registered another size is a job's, and
 * psbench --attach refuses it. */
#define PB_CLIENT_SAMPLES (1ull << 40)

/** @brief Run the client role: `psbench --client --manifest M --sizes LIST`.
 *  @return the process exit code. */
int pb_client_main(int argc, char **argv);

#endif
