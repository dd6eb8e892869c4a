#!/usr/bin/env python3
"""Where a kernel's executed instructions go, from Nsight Compute's per-instruction counts.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` for one kernel (a
report taken with --section SourceCounters). Consecutive SASS instructions that executed the
same number of times form a run: a loop body, a branch's block, a spin loop. Prints the kernel's
totals, its local-memory traffic (spills), and the runs that executed the most instructions, each
with its share of the instructions and of the warp stall samples and its most frequent opcodes.
Standard library only, so that it runs where ncu does.
"""
import argparse
import collections
import csv
import sys


def read_instructions(path):
    """(address, SASS text, stall samples, executed warp instructions) per instruction."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if header_at is None:
        sys.exit(f"{path}: no 'Address' / 'Source' header: not an ncu source page CSV")
    header = rows[header_at]
    address = header.index("Address")
    source = header.index("Source")
    samples = header.index("Warp Stall Sampling (All Samples)")
    executed = header.index("Instructions Executed")
    out = []
    for r in rows[header_at + 1:]:
        if len(r) < len(header):
            continue
        try:
            out.append((int(r[address], 16), r[source].strip(), int(r[samples]), int(r[executed])))
        except ValueError:
            continue  # a row that is not an instruction
    return out


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):  # predicate
        words = words[1:]
    return words[0] if words else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=20, help="runs to list (default 20)")
    args = parser.parse_args()

    instructions = read_instructions(args.csv)
    if not instructions:
        sys.exit(f"{args.csv}: no instructions")
    total = sum(i[3] for i in instructions)
    samples = sum(i[2] for i in instructions) or 1
    local = sum(i[3] for i in instructions if opcode(i[1]).startswith(("LDL", "STL")))
    print(f"{len(instructions)} SASS instructions, {total} warp instructions executed, "
          f"{samples} stall samples, {local} local loads and stores executed")

    runs = []  # [first address, [SASS], executed each, samples]
    for addr, sass, smp, ex in instructions:
        if runs and runs[-1][2] == ex:
            runs[-1][1].append(sass)
            runs[-1][3] += smp
        else:
            runs.append([addr, [sass], ex, smp])
    runs.sort(key=lambda r: -r[2] * len(r[1]))
    print("first address  executed x length  instructions  samples  opcodes")
    for addr, body, ex, smp in runs[:args.top]:
        ops = collections.Counter(opcode(s) for s in body).most_common(6)
        print(f"{addr:#014x} {ex:10d} x {len(body):4d}  {100 * ex * len(body) / total:10.1f} %"
              f"  {100 * smp / samples:5.1f} %  " + " ".join(f"{o}:{n}" for o, n in ops))


if __name__ == "__main__":
    main()
