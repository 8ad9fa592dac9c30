"""python -m libsdpa info: what `sdpa info` prints (the library's own text)."""
import sys

import libsdpa


def main(argv):
    if argv[1:] == ["info"] or argv[1:] == []:
        sys.stdout.write(libsdpa.info_text())
        return 0
    if argv[1:] == ["info", "--json"]:
        import json
        print(json.dumps(libsdpa.info(), indent=2))
        return 0
    sys.stderr.write("usage: python -m libsdpa info [--json]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
