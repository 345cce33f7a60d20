"""Writes one benchmark's section of BENCHMARKS.md (repository root), between the markers
<!-- NAME:begin --> and <!-- NAME:end -->: replaced where it is, else appended."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "BENCHMARKS.md")


def write_section(name, text):
    """Put text (the section's Markdown, without markers) in BENCHMARKS.md as section name."""
    old = open(PATH).read() if os.path.exists(PATH) else "# Benchmarks\n"
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    if begin in old:
        new = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, old, flags=re.S)
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    with open(PATH, "w") as f:
        f.write(new)
    print(f"\nwrote the {name} section of {PATH}")
