#!/usr/bin/env python3
"""Lists the longest function bodies in the tracked C++ and CUDA sources.

A function is a top-level (or class-member, or namespace-level) brace block
whose opening line ends a signature: `name(...) ... {`. Lines are counted
from the signature's first line to the closing brace. Comments and strings
are stripped before braces are matched. Generated code (*.pb.*, the Unicode
tables) is left out.

    tools/longest_functions.py [--top N] [--main]
"""
import argparse
import re
import subprocess

GENERATED = re.compile(r"\.pb\.|unicode_data\.cc$|/fixtures/|/golden/")
SIGNATURE = re.compile(r"[\w:~<>,*&\s]+\([^;{}]*\)[^;{}]*$")
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|return|try)\b")


def strip_comments_and_strings(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'R"\((.*?)\)"', lambda m: '""' + "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\\n])'", "''", text)
    return text


def functions(path):
    lines = strip_comments_and_strings(open(path, encoding="utf-8", errors="replace").read()).split("\n")
    out, depth, stack = [], 0, []
    for i, line in enumerate(lines):
        for ch in line:
            if ch == "{":
                head = line[: line.index("{")] if "{" in line else line
                start = i
                # The signature may span lines above the brace.
                sig = head
                j = i
                while j > 0 and not re.search(r"[;{}]\s*$", lines[j - 1]) and len(sig) < 400 and lines[j - 1].strip():
                    j -= 1
                    sig = lines[j] + " " + sig
                    start = j
                is_fn = bool(SIGNATURE.search(sig.strip())) and not CONTROL.match(sig) and "=" not in sig.split("(")[0]
                stack.append((is_fn, start, sig.strip()))
                depth += 1
            elif ch == "}" and stack:
                is_fn, start, sig = stack.pop()
                depth -= 1
                if is_fn and not any(s[0] for s in stack):
                    name = re.search(r"([\w:~]+)\s*\(", sig)
                    out.append((i - start + 1, path, start + 1, name.group(1) if name else sig[:60]))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--main", action="store_true", help="list the services' and the launcher's main functions")
    args = parser.parse_args()
    files = subprocess.check_output(["git", "ls-files", "*.cc", "*.h", "*.cu", "*.cuh"], text=True).split()
    found = []
    for f in files:
        if not GENERATED.search(f):
            found += functions(f)
    if args.main:
        found = [f for f in found if f[1].endswith("_main.cc") and f[3] in ("Main", "main")]
    for length, path, line, name in sorted(found, reverse=True)[: args.top]:
        print(f"{length:5d}  {path}:{line}  {name}")


if __name__ == "__main__":
    main()
