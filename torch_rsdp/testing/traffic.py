"""How many bytes a collective must send across one node's link (the network), by algorithm.

Used by the multi-node tests (compared with torch_rsdp.comm_stats) and by the multinode
benchmark suite (bytes / time = how well an algorithm uses the link).
"""

from __future__ import annotations


def inter_node_bytes_per_node(op: str, algo: str, nbytes: int, num_nodes: int,
                              local_size: int) -> float:
    """Bytes ONE node sends to other nodes (the sum of its ranks' inter_node_bytes) for one
    collective over M = num_nodes nodes x L = local_size ranks (N = M*L). By symmetry it also
    receives as much, so this is the load on each direction of the node's link.

    op / nbytes:
      "all_reduce":     nbytes = S, the size of the tensor being reduced;
      "all_gather":     nbytes = S, one rank's input block (the output is N*S);
      "reduce_scatter": nbytes = S, one rank's output block (the input is N*S).
    algo: "hier" (intra-node stage over shared memory, inter-node stage along rails) or
      "ring" (one flat ring over all N ranks; node-major, so the ranks of a node are adjacent
      and exactly one rank per node, the one whose successor is on the next node, sends
      across the link).

      hier all_reduce:  intra-node reduce-scatter leaves each local rank a slice of S/L; each
                        rail allreduces its slice with a ring over the M nodes, which sends
                        2(M-1)/M * S/L per rank; L ranks per node    -> 2(M-1)/M * S
      ring all_reduce:  a ring allreduce sends 2(N-1)/N * S per rank; one boundary rank
                        per node                                     -> 2(N-1)/N * S
      hier all_gather:  each rank's block travels once to the M-1 other nodes' rail peers
                        (rail ring): (M-1)*S per rank                -> (M-1)*L*S
      ring all_gather:  the boundary rank forwards N-1 blocks        -> (N-1)*S
      reduce_scatter:   the mirror image of all_gather (partial sums instead of blocks)
                        hier -> (M-1)*L*S, ring -> (N-1)*S

    With M = 1 nothing crosses a link. Exact when the splits are even; ceil/floor chunking
    of uneven sizes moves a few elements per chunk (see TOLERANCE).
    """
    M, L = num_nodes, local_size
    N = M * L
    if M <= 1:
        return 0.0
    if algo not in ("hier", "ring"):
        raise ValueError(f"algo must be hier or ring, got {algo!r}")
    if op == "all_reduce":
        return 2 * (M - 1) / M * nbytes if algo == "hier" else 2 * (N - 1) / N * nbytes
    if op in ("all_gather", "reduce_scatter"):
        return (M - 1) * L * nbytes if algo == "hier" else (N - 1) * nbytes
    raise ValueError(f"no traffic theory for {op!r}")


def tolerance(world_size: int, element_size: int) -> int:
    """Slack for ceil/floor chunking of sizes that do not split evenly: each of up to
    2*N chunk sends may carry one element more or less than its exact share."""
    return 2 * world_size * element_size * 2
