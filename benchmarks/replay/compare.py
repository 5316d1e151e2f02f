"""Compare two replays: ``python benchmarks/replay/compare.py base.jsonl new.jsonl [--show]``
prints how many groups differ in each field ("identical" when none), and with ``--show``
the first difference of each field."""

import collections
import json
import sys

FIELDS = ("reason", "reason_exc", "source", "metadata", "error")


def main(base: str, new: str, show: bool) -> int:
    a = [json.loads(line) for line in open(base)]
    b = [json.loads(line) for line in open(new)]
    if len(a) != len(b):
        print(f"{len(a)} against {len(b)} records: not replays of one recording")
        return 2
    diff: dict[str, list] = collections.defaultdict(list)
    for x, y in zip(a, b):
        for k in FIELDS:
            if x.get(k) != y.get(k):
                diff[k].append((x, y))
    print({k: len(v) for k, v in diff.items()} or "identical", len(a), "records")
    if show:
        for k, pairs in diff.items():
            x, y = pairs[0]
            print(f"== {k} ({x['codegen']}, where {y.get('where')})\n{x.get(k)}\n--\n{y.get(k)}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], "--show" in sys.argv[3:]))
