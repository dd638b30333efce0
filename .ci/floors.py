"""Print requirements.txt with each lower bound made exact (name>=X -> name==X), for CI's floors
environment: generated, so the pins can never drift from the declared floors.

    python .ci/floors.py requirements.txt > floors.txt
"""
import re
import sys

FLOOR = re.compile(r"^\s*([A-Za-z0-9._\-\[\]]+)\s*>=\s*([^\s,;#]+)\s*(?:#.*)?$")


def pins(lines):
    """Each requirement line: its floor pinned, or (no floor, e.g. ninja) as it is; comments dropped."""
    for req in filter(None, (line.split("#", 1)[0].strip() for line in lines)):
        if not (match := FLOOR.match(req)) and ("," in req or ">" in req or "<" in req or "~=" in req):
            sys.exit(f"floors.py: cannot pin {req!r}: only name>=version or a bare name")
        yield f"{match[1]}=={match[2]}" if match else req


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print("\n".join(pins(f)))
