#!/usr/bin/env python3
"""Checks a directory of TensorBoard event files with TensorBoard's own readers.

Reads the scalars of every event file in --logdir twice, both ways
TensorBoard itself does, and compares each with --expected:

- EventAccumulator(...).Scalars(tag), the legacy API that returns the
  Summary.Value.simple_value scalars as written;
- event_file_loader.EventFileLoader, which migrates those to the scalar
  tensors (plugin "scalars") that TensorBoard's UI plots.

    python3 tools/tensorboard_readback.py --logdir=run.out/tb --expected=expected.json

expected.json maps each tag to its [[step, value], ...] in the order they
were written. The files store float32, so a value matches within float32
rounding of the expected one. Both readers stop quietly at a record whose
CRC fails (they take it for a write still in progress), so a corrupt file
shows here as missing steps.

Exit status: 0 when both readers see exactly the expected scalars (and the
files' version is "brain.Event:2"); 1 naming each difference; 2 for bad
arguments or input; 77 when tensorboard cannot be imported (ctest's skip).
"""
import argparse
import json
import math
import os
import sys

FILE_VERSION = "brain.Event:2"
# The relative spacing of float32 values: the writer rounds each value to
# the nearest float32, half of this at most.
FLOAT32_EPS = 2.0 ** -23
SKIP = 77


def import_tensorboard():
    """Returns (event_accumulator, event_file_loader, tensor_util), or exits 77."""
    try:
        from tensorboard.backend.event_processing import event_accumulator, event_file_loader
        from tensorboard.util import tensor_util
    except ImportError as e:
        print(f"tensorboard_readback: cannot import tensorboard ({e}); "
              "install it (pip install tensorboard) to run this check", file=sys.stderr)
        sys.exit(SKIP)
    return event_accumulator, event_file_loader, tensor_util


def read_expected(path):
    """Returns {tag: [(step, value), ...]} from the JSON file at `path`."""
    with open(path) as f:
        raw = json.load(f)
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a non-empty object of tag -> [[step, value], ...]")
    expected = {}
    for tag, points in raw.items():
        if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 for p in points):
            raise ValueError(f"{path}: tag {tag!r}: expected a list of [step, value] pairs")
        expected[tag] = [(int(step), float(value)) for step, value in points]
    return expected


def event_files(logdir):
    """The files TensorBoard reads in `logdir` (names containing "tfevents"), sorted."""
    names = sorted(n for n in os.listdir(logdir) if "tfevents" in n)
    if not names:
        raise ValueError(f"{logdir}: no event file (no name containing 'tfevents')")
    return [os.path.join(logdir, n) for n in names]


def read_with_accumulator(event_accumulator, logdir):
    """{tag: [(step, value), ...]} through EventAccumulator.Scalars(), every point kept."""
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def scalar_of_migrated_value(tensor_util, value, path):
    """The number in one value as EventFileLoader hands it to the UI, or None if not a scalar."""
    if value.metadata.plugin_data.plugin_name != "scalars":
        return None
    array = tensor_util.make_ndarray(value.tensor)
    if array.shape != ():
        raise ValueError(f"{path}: tag {value.tag!r}: scalar tensor of shape {array.shape}")
    return float(array)


def read_with_loader(event_file_loader, tensor_util, paths):
    """({tag: [(step, value), ...]}, [file_version of each file]) through EventFileLoader."""
    scalars, versions = {}, []
    for path in paths:
        for event in event_file_loader.EventFileLoader(path).Load():
            if event.HasField("file_version"):
                versions.append(event.file_version)
            for value in event.summary.value:
                number = scalar_of_migrated_value(tensor_util, value, path)
                if number is not None:
                    scalars.setdefault(value.tag, []).append((event.step, number))
    return scalars, versions


def close_enough(actual, expected):
    return math.isclose(actual, expected, rel_tol=FLOAT32_EPS, abs_tol=0.0) or actual == expected


def compare(reader, actual, expected):
    """Lines naming each difference between `actual` and `expected` read by `reader`."""
    problems = []
    for tag in sorted(set(actual) - set(expected)):
        problems.append(f"{reader}: unexpected tag {tag!r} ({len(actual[tag])} points)")
    for tag, want in expected.items():
        got = actual.get(tag, [])
        if len(got) != len(want):
            problems.append(f"{reader}: tag {tag!r}: {len(got)} points, expected {len(want)}")
        for (step, value), (want_step, want_value) in zip(got, want):
            if step != want_step or not close_enough(value, want_value):
                problems.append(f"{reader}: tag {tag!r}: got step {step} value {value!r}, "
                                f"expected step {want_step} value {want_value!r}")
                break
    return problems


def check(logdir, expected):
    """Every difference found by either reader, and the points compared."""
    event_accumulator, event_file_loader, tensor_util = import_tensorboard()
    paths = event_files(logdir)
    by_loader, versions = read_with_loader(event_file_loader, tensor_util, paths)
    problems = []
    if versions != [FILE_VERSION] * len(paths):
        problems.append(f"EventFileLoader: file versions {versions} in {len(paths)} files, "
                        f"expected {FILE_VERSION!r} in each")
    problems += compare("EventAccumulator.Scalars", read_with_accumulator(event_accumulator, logdir),
                        expected)
    problems += compare("EventFileLoader", by_loader, expected)
    return problems


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--logdir", required=True, help="directory of event files")
    p.add_argument("--expected", required=True, help="JSON: tag -> [[step, value], ...]")
    args = p.parse_args(argv)
    try:
        expected = read_expected(args.expected)
        problems = check(args.logdir, expected)
    except (OSError, ValueError) as e:
        print(f"tensorboard_readback: {e}", file=sys.stderr)
        return 2
    points = sum(len(v) for v in expected.values())
    if problems:
        print("\n".join(["tensorboard_readback: FAILED"] + problems), file=sys.stderr)
        return 1
    print(f"tensorboard_readback: OK, {points} points of {len(expected)} tags in {args.logdir} "
          "read alike by EventAccumulator.Scalars and EventFileLoader")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
