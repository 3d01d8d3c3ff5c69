#!/usr/bin/env python3
"""Static SASS counts per kernel: instructions in total and in the longest loop (the row loop of a
persistent kernel), with the most frequent opcodes there. The figures that NOTES quotes as
"instructions per thread per row" come from here (scripts/sass_count.sh runs it).

usage: sass_count.py FILE.sass...   (cuobjdump -sass output)
"""
import re
import sys


def functions(path):
    current, out = None, {}
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = m.group(1)
            out[current] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and current:
            out[current].append((int(m.group(1), 16), m.group(2).strip()))
    return out


def longest_loop(instructions):
    """(length, first, last) of the longest backward branch's span, in instructions."""
    best = (0, 0, 0)
    for address, text in instructions:
        m = re.search(r"BRA (?:\S+ )?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < address:
            target = int(m.group(1), 16)
            span = (address - target) // 16 + 1
            if span > best[0]:
                best = (span, target, address)
    return best


def main(paths):
    if not paths:
        sys.exit(__doc__)
    for path in paths:
        for name, instructions in functions(path).items():
            if name.endswith("_reduce"):
                continue
            span, first, last = longest_loop(instructions)
            ops = {}
            for address, text in instructions:
                if first <= address <= last:
                    op = re.sub(r"^@!?U?P\w+ ", "", text).split()[0].split(".")[0]
                    ops[op] = ops.get(op, 0) + 1
            top = " ".join(f"{k}:{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:10])
            print(f"{name}: total {len(instructions)}, loop {span}  [{top}]")


if __name__ == "__main__":
    main(sys.argv[1:])
