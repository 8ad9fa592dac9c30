#!/usr/bin/env python3
"""ISA, feature and architecture names are spelled in one table only.

usage: test_spellings.py REPO_ROOT

Reads the names src/core/cpu_features.c's tables define (features with
their aliases, ISA levels, architectures) and fails on any C string literal
elsewhere under src/ that spells one of them as a word: such a string would
be a second copy of the table that the next architecture has to find and
edit. Backend names (cpu.avx2, cpu.neon) are names of backends, not of ISAs,
and are left out; so are comments and prose in capitals ("AVX-512",
"NEON"), which are titles for sentences. Prints "N passed, N failed" last.
"""
import os
import re
import sys

root = sys.argv[1]
table_c = os.path.join(root, "src", "core", "cpu_features.c")
table_h = os.path.join(root, "src", "core", "cpu_features.h")
text = open(table_c).read()
names = set()
for row in re.findall(r"\{SDPA_CPU_\w+, ([^}]*)\}", text):  # feature rows
    names.update(re.findall(r'"([a-z0-9_-]+)"', row.split(",")[0] + "," + row.split(",")[1]))
names.update(re.findall(r'\{"([a-z0-9_]+)", (?:NULL|SDPA_ARCH_\w+), ', text))  # level rows
names.update(re.findall(r'#define SDPA_ARCH_\w+ "([a-z0-9_]+)"', open(table_h).read()))
passed = failed = 0
expected = {"avx2", "avx512", "avx512bf16", "amx-bf16", "amx", "neon", "portable", "x86_64",
            "aarch64"}  # before "portable" leaves the list below
if expected <= names:
    passed += 1
else:
    failed += 1
    print(f"FAIL the table's names were not read: {sorted(names)}")

# "portable" is the lowest level's name and an English word: prose keeps it.
names.discard("portable")
# Allowed: a JSON key that is not an ISA name ("amx": the AMX permission
# state); the tile emulator's own message (tests only).
allowed = {("src/dispatch/info.c", "amx"), ("src/cpu/amx/amx_tiles.h", "amx")}
literal = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
comment = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
for dirpath, _, files in os.walk(os.path.join(root, "src")):
    for f in files:
        path = os.path.join(dirpath, f)
        rel = os.path.relpath(path, root)
        if not f.endswith((".c", ".h", ".cu", ".cuh")) or rel in (
                "src/core/cpu_features.c", "src/core/cpu_features.h"):
            continue
        code = comment.sub(" ", open(path, errors="replace").read())
        code = re.sub(r"^\s*#\s*include[^\n]*", " ", code, flags=re.M)  # file paths
        code = re.sub(r"target\(\"[^\"]*\"\)", " ", code)  # GCC's target attribute syntax
        for lit in literal.findall(code):
            words = re.sub(r"\bcpu\.[a-z0-9_]+", " ", lit)  # backend names
            for w in re.findall(r"[a-z0-9_]+(?:-[a-z0-9]+)*", words):
                if w in names and (rel, w) not in allowed:
                    failed += 1
                    print(f"FAIL {rel}: \"{lit}\" spells '{w}', a name of "
                          "src/core/cpu_features.c's tables")
                else:
                    passed += 1
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
