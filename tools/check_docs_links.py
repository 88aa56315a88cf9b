#!/usr/bin/python3
"""Checks that the documentation names only files that exist.

  tools/check_docs_links.py [--source_dir=.] [FILE.md ...]

Without files it checks README.md, every docs/**/*.md and deploy/README.md.
Exit 0 when every reference resolves, 1 with one line per broken one
("FILE:LINE: what"), 2 on a usage error.

What is checked, outside fenced code blocks (``` or ~~~; their lines are
commands and output, full of placeholders):

1. Markdown links and images, [text](target) and ![alt](target), and
   reference definitions "[label]: target". A target with a scheme
   (http:, https:, mailto:, ...) is not checked. Any other target is a path
   relative to the file that names it; it must exist (a file, or a folder).
   A "#anchor" after it, or a target that is only "#anchor", must be the
   GitHub anchor of a heading of the target Markdown file (lower case,
   punctuation but "-" and "_" dropped, spaces to "-", "-1", "-2", ... for
   repeats).

2. Repository paths in inline code (`...`). Each whitespace-separated word
   of a code span is a candidate, after taking the value of a flag
   (--config=examples/configs/demo.yaml gives examples/configs/demo.yaml),
   stripping quotes and trailing punctuation, and a ":LINE" suffix. A
   candidate is checked when all of these hold; the others are not paths
   of this repository by this rule:
   - it contains "/", and its last part has an extension (".md", ".cc",
     ".sbatch", ...) or it ends with "/" (a folder);
   - it holds no placeholder or pattern: none of < > * ? { } $ ~ and no
     "..." (docs/decisions/*.md, <run.out>/run.png, $OUT/...);
   - it is relative (no leading "/") and has no URL scheme;
   - its first part is a top-level entry of the repository that git keeps:
     a file or folder at the root ("./" before it is dropped: commands
     run from the root), except what the root .gitignore anchors there (/build*/, /demo-run/, ...). So build outputs
     (build/launcher/e3_launch) and run outputs (run/draft,
     demo-run/run.png, e3-run-123/...) are never checked: they are not in
     the repository. A first part that is an entry of the naming file's
     own folder (slurm/e3-train.sbatch in deploy/README.md) counts too,
     and the path is then taken relative to that folder.
   Such a path must exist; with a "#anchor", that heading must exist in it.
"""
import argparse
import fnmatch
import os
import re
import sys
import unicodedata
import urllib.parse

DEFAULT_FILES = ["README.md", "deploy/README.md"]
FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target "title") and ![alt](target); text may hold `code` and
# nested brackets one level deep.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
PLACEHOLDER = re.compile(r"[<>*?{}$~]|\.\.\.")
EXTENSION = re.compile(r"\.[A-Za-z0-9]+$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def github_anchor(heading):
    """The id GitHub gives a heading's text (before de-duplication)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").strip().lower()
    out = []
    for ch in text:
        if ch in " -_" or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            out.append("-" if ch == " " else ch)
    return "".join(out)


class Repo:
    def __init__(self, root):
        self.root = os.path.abspath(root)
        ignored = []
        gitignore = os.path.join(self.root, ".gitignore")
        if os.path.exists(gitignore):
            for line in open(gitignore, encoding="utf-8"):
                line = line.strip()
                if line.startswith("/"):  # anchored at the root
                    ignored.append(line.strip("/"))
        self.top_level = {name for name in os.listdir(self.root)
                          if name != ".git" and not any(fnmatch.fnmatch(name, p) for p in ignored)}
        self._anchors = {}

    def anchors(self, path):
        if path not in self._anchors:
            seen = {}
            found = set()
            fenced = False
            for line in open(path, encoding="utf-8"):
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                m = None if fenced else HEADING.match(line)
                if not m:
                    continue
                base = github_anchor(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
            self._anchors[path] = found
        return self._anchors[path]

    def rel(self, path):
        return os.path.relpath(path, self.root)


def check_target(repo, doc, target, where, problems, relative_to):
    """A path (with an optional #anchor) relative to `relative_to`."""
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path)
    full = os.path.normpath(os.path.join(relative_to, path)) if path else doc
    if not full.startswith(repo.root + os.sep) and full != repo.root:
        problems.append(f"{where}: {target} points outside the repository")
        return
    if not os.path.exists(full):
        problems.append(f"{where}: {target}: no such file or folder ({repo.rel(full)})")
        return
    if path.endswith("/") and not os.path.isdir(full):
        problems.append(f"{where}: {target}: not a folder")
        return
    if anchor:
        if not full.endswith(".md") or not os.path.isfile(full):
            problems.append(f"{where}: {target}: an anchor into a file that is not Markdown")
        elif anchor.lower() not in repo.anchors(full):
            problems.append(f"{where}: {target}: {repo.rel(full)} has no heading with the anchor #{anchor}")


def path_candidates(code):
    """The words of an inline code span that may be repository paths."""
    for word in code.split():
        if word.startswith("-") and "=" in word:
            word = word.split("=", 1)[1]
        word = word.strip("\"'`,;()[]")
        word = re.sub(r":\d+(-\d+)?$", "", word)  # file:LINE
        word = word.rstrip(".:")
        if word.startswith("./"):  # a command run from the root
            word = word[2:]
        if word:
            yield word


def repo_path(repo, doc_dir, word):
    """Where `word` resolves when the rule says it names a repository path,
    else None."""
    if "/" not in word or SCHEME.match(word) or word.startswith("/") or PLACEHOLDER.search(word):
        return None
    path = word.split("#", 1)[0]
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if not (path.endswith("/") or EXTENSION.search(last)):
        return None
    first = path.split("/", 1)[0]
    if first in repo.top_level:
        return repo.root
    if doc_dir != repo.root and os.path.exists(os.path.join(doc_dir, first)):
        return doc_dir
    return None


def check_file(repo, doc, problems):
    doc_dir = os.path.dirname(doc)
    fenced = False
    for number, line in enumerate(open(doc, encoding="utf-8"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        where = f"{repo.rel(doc)}:{number}"
        spans = [m.group(2) for m in CODE_SPAN.finditer(line)]
        outside_code = CODE_SPAN.sub("", line)
        targets = [m.group(1) for m in LINK.finditer(outside_code)]
        targets += [m.group(1) for m in REFERENCE.finditer(outside_code)]
        for target in targets:
            target = target.strip("<>")
            if SCHEME.match(target):
                continue
            check_target(repo, doc, target, where, problems, doc_dir)
        for code in spans:
            for word in path_candidates(code):
                base = repo_path(repo, doc_dir, word)
                if base is not None:
                    check_target(repo, doc, word, where, problems, base)


def self_test():
    """The rule on a small repository: what must be found broken, and what
    must pass or not be checked at all."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="check-docs-links-") as root:
        def write(path, text=""):
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
        write(".gitignore", "/build*/\n/demo-run/\n")
        write("build/launcher/e3_launch")
        write("tools/run.py")
        write("deploy/slurm/job.sbatch")
        write("docs/guide.md", "# A Guide: `setup`, again!\n\n## Step 1\n\n## Step 1\n")
        write("deploy/README.md",
              "[guide](../docs/guide.md#step-1-1) `slurm/job.sbatch` `slurm/gone.sbatch` `deploy/slurm/`\n")
        write("docs/page.md", "\n".join([
            "[ok](guide.md) [ok](guide.md#a-guide-setup-again) [ok](#local) ![img](../tools/run.py)",
            "[bad](missing.md) [bad](guide.md#nope) [bad](#nowhere) [web](https://example.com/x.md)",
            "`tools/run.py` `./tools/run.py --flag` `--script=tools/run.py:12` `tools/gone.py` `tools/`",
            "`build/launcher/e3_launch` `run/draft/config.json` `demo-run/run.png` `docs/*.md`",
            "`<run.out>/run.png` `/etc/x.yaml` `tools/none/` `e3_student_acc{step}` `a/b`",
            "```", "[inside](fenced.md) `tools/fenced.py`", "```",
            "## Local", "[ref]: guide.md#step-1", "[ref2]: gone.md",
        ]) + "\n")
        repo = Repo(root)
        problems = []
        for doc in ("docs/page.md", "deploy/README.md"):
            check_file(repo, os.path.join(repo.root, doc), problems)
        found = sorted(re.sub(r":\d+: ", " ", p).split(":")[0] for p in problems)
        want = sorted([
            "deploy/README.md slurm/gone.sbatch",
            "docs/page.md #nowhere",
            "docs/page.md gone.md",
            "docs/page.md guide.md#nope",
            "docs/page.md missing.md",
            "docs/page.md tools/gone.py",
            "docs/page.md tools/none/",
        ])
        if found != want:
            print("check_docs_links self-test: found\n  " + "\n  ".join(problems) + "\nwanted\n  " +
                  "\n  ".join(want))
            return 1
    print("check_docs_links self-test: ok")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source_dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--self_test", action="store_true", help="check the rule itself on a small repository")
    parser.add_argument("files", nargs="*", help="Markdown files (default: README.md, docs/**/*.md, deploy/README.md)")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    repo = Repo(args.source_dir)
    files = args.files
    if not files:
        files = [f for f in DEFAULT_FILES if os.path.exists(os.path.join(repo.root, f))]
        for folder, _, names in os.walk(os.path.join(repo.root, "docs")):
            files += [repo.rel(os.path.join(folder, n)) for n in sorted(names) if n.endswith(".md")]
    problems = []
    for f in files:
        path = os.path.abspath(os.path.join(repo.root, f))
        if not os.path.isfile(path):
            print(f"check_docs_links: {f}: no such file", file=sys.stderr)
            return 2
        check_file(repo, path, problems)
    for p in problems:
        print(p)
    print(f"check_docs_links: {len(files)} file(s), {len(problems)} broken reference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
