"""`python .ci/floors.py requirements.txt`: each floor made exact (name>=X -> name==X) for CI's floors
environment; generated, so the pins never drift from the declared floors."""
import re
import sys
from pathlib import Path

FLOOR = re.compile(r"^([A-Za-z0-9._\-\[\]]+)\s*>=\s*([^\s,;]+)$")


def pins(lines):
    """Each requirement with its floor pinned, or (no floor, e.g. ninja) as it is; comments dropped."""
    for line in lines:
        req = line.split("#", 1)[0].strip()
        if match := FLOOR.match(req):
            yield f"{match[1]}=={match[2]}"
        elif re.search(r"[<>,]|~=", req):
            sys.exit(f"floors.py: cannot pin {req!r}: only name>=version or a bare name")
        elif req:
            yield req


if __name__ == "__main__":
    print("\n".join(pins(Path(sys.argv[1]).read_text().splitlines())))
