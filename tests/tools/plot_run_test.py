#!/usr/bin/env python3
"""tools/plot_run.py on a step log as the student writes it: the PNG is a
valid image of the expected size, its figure holds the six panels, and a
bad step log is refused naming the file and line."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "plot_run.py")
EXPECTED_PANELS = ["loss", "acc_j per TTT step", "tau: simulated and real",
                   "throughput (tokens/s)", "data wait (% of step time)", "learning rate"]


def step_log(path, steps=40, evals=(20, 40)):
    with open(path, "w") as f:
        for s in range(1, steps + 1):
            acc = [min(0.9, 0.02 * s / (j + 1)) for j in range(7)]
            f.write(json.dumps({"step": s, "loss": 16.0 - 0.1 * s, "simulated_tau": 1 + acc[0], "acc": acc,
                                "lr": 1e-3, "tokens": 1000, "seconds": 1.1, "data_wait_seconds": 0.01}) + "\n")
            if s in evals:
                f.write(json.dumps({"step": s, "eval": {"chains": [3, 5, 7], "prompts": 32, "seconds": 2.0,
                                                        "tau": {"3": 1.1, "5": 1.15, "7": 1.2},
                                                        "rounds": {"3": 900, "5": 880, "7": 870}}}) + "\n")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)


class PlotRunTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="plot_run_test")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_png_is_valid_and_has_every_panel(self):
        log = os.path.join(self.dir, "steps.jsonl")
        out = os.path.join(self.dir, "run.png")
        step_log(log)
        r = run("--step_log=" + log, "--out=" + out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(data[12:16], b"IHDR")
        width, height = struct.unpack(">II", data[16:24])
        self.assertEqual((width, height), (1500, 800))
        self.assertGreater(len(data), 20000)  # six drawn panels, not a blank canvas
        self.assertEqual(data[-8:-4], b"IEND")
        with open(out + ".json") as f:
            sidecar = json.load(f)
        self.assertEqual(sidecar["panels"], EXPECTED_PANELS)
        self.assertEqual((sidecar["steps"], sidecar["evals"]), (40, 2))
        self.assertEqual((sidecar["first_step"], sidecar["last_step"]), (1, 40))
        # The image decodes, and its panels are not empty: pixels vary.
        import matplotlib.image
        pixels = matplotlib.image.imread(out)
        self.assertEqual(pixels.shape[:2], (800, 1500))
        self.assertGreater(float(pixels[:, :, :3].std()), 0.05)

    def test_bad_step_logs_are_refused_by_file_and_line(self):
        bad = os.path.join(self.dir, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(json.dumps({"step": 1, "loss": 1.0, "simulated_tau": 1.0, "acc": [0.1], "tokens": 5,
                                "seconds": 1.0}) + "\n{not json\n")
        r = run("--step_log=" + bad)
        self.assertEqual(r.returncode, 1)
        self.assertIn(bad + ":2: not JSON", r.stderr)
        empty = os.path.join(self.dir, "empty.jsonl")
        open(empty, "w").close()
        r = run("--step_log=" + empty)
        self.assertEqual(r.returncode, 1)
        self.assertIn(empty + ": no training steps", r.stderr)


if __name__ == "__main__":
    unittest.main()
