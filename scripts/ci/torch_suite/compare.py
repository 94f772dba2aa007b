"""Compares the outcomes of PyTorch's distributed suite on gloo and on oxccl standing in for
gloo, test by test, from the JUnit files ``scripts/ci/torch_suite.sh`` wrote.

    python compare.py OUT_DIR

reads ``OUT_DIR/ws{N}-{backend}.xml`` for every world size N found, prints one line per test
(the outcome on each backend at each world size), the totals, and then every test that
passes on gloo and not on oxccl. Exits 1 when there is such a test that is not in
``NAME_ONLY`` (tests that can fail only because they compare the backend's name with
"gloo"), else 0.
"""

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

# Tests that compare the group's backend name with "gloo": on oxccl they see "oxccl", which is
# the point of a backend of its own, so they are the only ones allowed to differ.
NAME_ONLY = {
    "test_get_backend",
}

SHORT = {"passed": "pass", "failed": "FAIL", "error": "ERR", "skipped": "skip", "missing": "-"}


def outcomes(path):
    """{test name: outcome} of one JUnit file."""
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        if case.find("failure") is not None:
            outcome = "failed"
        elif case.find("error") is not None:
            outcome = "error"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        result[name] = outcome
    return result


def main(out_dir):
    out = Path(out_dir)
    runs = defaultdict(dict)  # world size -> backend -> {test: outcome}
    for f in sorted(out.glob("ws*-*.xml")):
        m = re.fullmatch(r"ws(\d+)-(\w+)\.xml", f.name)
        if m:
            runs[int(m.group(1))][m.group(2)] = outcomes(f)
    if not runs:
        print(f"no ws*-*.xml in {out}", file=sys.stderr)
        return 2
    sizes = sorted(runs)
    backends = ["gloo", "oxccl"]
    tests = sorted({t for ws in sizes for b in backends for t in runs[ws].get(b, {})})
    width = max(len(t) for t in tests)
    head = "  ".join(f"ws{ws}:{b:<5}" for ws in sizes for b in backends)
    print(f"{'test':<{width}}  {head}")
    regressions = []
    totals = defaultdict(lambda: defaultdict(int))
    for t in tests:
        cells = []
        for ws in sizes:
            got = {b: runs[ws].get(b, {}).get(t, "missing") for b in backends}
            for b in backends:
                totals[(ws, b)][got[b]] += 1
                cells.append(f"{SHORT[got[b]]:<{len(f'ws{ws}:{b:<5}')}}")
            if got["gloo"] == "passed" and got["oxccl"] != "passed":
                regressions.append((ws, t, got["oxccl"]))
        print(f"{t:<{width}}  " + "  ".join(cells))
    print()
    for ws in sizes:
        for b in backends:
            c = totals[(ws, b)]
            print(f"world size {ws}, {b:<5}: {c['passed']} passed, {c['failed'] + c['error']} failed, "
                  f"{c['skipped']} skipped, {c['missing']} not run")
    print()
    unexplained = [r for r in regressions if r[1] not in NAME_ONLY]
    print(f"passed on gloo and not on oxccl: {len(regressions)} "
          f"({len(regressions) - len(unexplained)} compare the backend's name)")
    for ws, t, o in regressions:
        why = "  (compares the backend's name)" if t in NAME_ONLY else ""
        print(f"  ws{ws} {t}: {o}{why}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
