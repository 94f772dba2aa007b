# Summarizes the `scale ...` lines of the ranks of one world (scripts/bench/scale_check.sh,
# scripts/peers/scale_init.sh): ranks that succeeded, each rank's own init time (max and median),
# the wall from the first rank's init start to the last rank's init end, the longest
# operations, and the most threads and descriptors of any rank. Variables: n (ranks),
# k (ranks per host), label (first column, optional).
#
# Usage: awk -v n=N -v k=K -v label=NAME -f scripts/bench/scale_summary.awk RANK_OUTPUT...
/^scale / {
  for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  if (v["ok"] != 1) next
  ok++
  d = (v["init_end_ns"] - v["init_start_ns"]) / 1e6; inits[ok] = d
  if (d > imax) imax = d
  if (smin == "" || v["init_start_ns"] < smin) smin = v["init_start_ns"]
  if (v["init_end_ns"] > emax) emax = v["init_end_ns"]
  if (v["ops_ms"] > omax) omax = v["ops_ms"]
  if (v["threads"] > tmax) tmax = v["threads"]
  if (v["fds"] > fmax) fmax = v["fds"]
  delete v
}
END {
  # The median, by insertion sort (mawk has no asort).
  for (i = 2; i <= ok; i++) { x = inits[i]; for (j = i - 1; j >= 1 && inits[j] > x; j--) inits[j + 1] = inits[j]; inits[j + 1] = x }
  p50 = ok ? inits[int((ok + 1) / 2)] : 0
  printf "%-6s %6d %6d %5d %12.1f %12.1f %9.1f %10.1f %11d %7d\n", label, n, (n + k - 1) / k, ok, imax, p50, (emax - smin) / 1e6, omax, tmax, fmax
}
