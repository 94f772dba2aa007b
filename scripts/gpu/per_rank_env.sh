#!/usr/bin/env bash
# Runs its arguments with NCCL's per-rank settings for several ranks on one GPU
# (docs/gpu.md): a host id per rank, so NCCL's duplicate-GPU check passes and the
# ranks talk over its socket transport on loopback.
export NCCL_HOSTID="host${RANK:-${OMPI_COMM_WORLD_RANK:-0}}"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
exec "$@"
