"""What the Python peer harnesses share (they run as scripts; this folder is on their path)."""


def compact(cpus):
    """[0, 1, 2, 5] -> "0-2,5"."""
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


# Operations whose buffers are n equal blocks: their element count is rounded down to a
# multiple of the rank count, the same for every peer.
BLOCKED = ("all_gather", "reduce_scatter", "all_to_all")


def element_counts(op, nbytes, n):
    """(f32 elements per buffer, elements per block) that every peer measures for `op` on
    `nbytes` over `n` ranks."""
    count = nbytes // 4
    if op in BLOCKED:
        count -= count % n
    return count, count // n
