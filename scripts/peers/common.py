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
