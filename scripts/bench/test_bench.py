"""Unit tests of the bench-compare helpers (no peers, no ranks needed).

    /usr/bin/python3 -m unittest discover -s scripts/bench -p 'test_*.py'
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import summarize  # noqa: E402


class SizeTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(common.parse_size("4"), 4)
        self.assertEqual(common.parse_size("4KiB"), 4096)
        self.assertEqual(common.parse_size("64MiB"), 64 << 20)
        self.assertEqual(common.parse_sizes("4,64MiB"), [4, 64 << 20])
        self.assertEqual(common.parse_sizes("4..32,1MiB"), [4, 8, 16, 32, 1 << 20])
        self.assertEqual(len(common.parse_sizes("4..64MiB")), 25)
        self.assertEqual(common.split_sizes([4, 512 << 10, 1 << 20, 64 << 20]), ([4, 512 << 10], [1 << 20, 64 << 20]))
        with self.assertRaises(Exception):
            common.parse_size("12 parsecs")

    def test_median_and_result(self):
        self.assertEqual(common.median([3, 1, 2]), 2)
        self.assertEqual(common.median([4, 1, 2, 3]), 2.5)
        r = common.result("gloo", "tcp", 2, 64 << 20, [1000.0, 2000.0, 3000.0])
        self.assertEqual(r["time_us"], 2000.0)
        self.assertAlmostEqual(r["algbw_GBps"], (64 << 20) / 2e-3 / 1e9, places=5)
        self.assertAlmostEqual(r["busbw_GBps"], r["algbw_GBps"])  # 2(n-1)/n = 1 for n = 2
        self.assertEqual((r["mean_us"], r["p50_us"], r["p90_us"]), (2000.0, 2000.0, 3000.0))
        r = common.result("openmpi", "shm", 2, 4, [float(x) for x in range(1, 11)])
        self.assertEqual((r["mean_us"], r["p50_us"], r["p90_us"]), (5.5, 5.5, 9.0))
        r4 = common.result("gloo", "tcp", 4, 64 << 20, [2000.0])
        self.assertAlmostEqual(r4["busbw_GBps"], r4["algbw_GBps"] * 1.5, places=5)


class TagTest(unittest.TestCase):
    def run_tag(self, text, *sets):
        args = [sys.executable, os.path.join(HERE, "tag.py")]
        for s in sets:
            args += ["--set", s]
        return subprocess.run(args, input=text, capture_output=True, text=True)

    def test_keeps_rank0_records_only(self):
        text = "\n".join([
            '02:11:10.631 INF embedded NATS server started',
            '[rank 1] {"bytes":4,"time_us":9.0}',
            '\x1b[36m[rank 0]\x1b[0m {"bytes":4,"count":1,"time_us":7.5}',
            '[rank 0] {"level":"info","message":"ranktree closed"}',
            '{"peer":"gloo","bytes":64,"time_us":1.0}',
            '[rank 0] not json {',
        ]) + "\n"
        p = self.run_tag(text, "peer=ranktree", "round=2")
        self.assertEqual(p.returncode, 0, p.stderr)
        recs = [json.loads(x) for x in p.stdout.splitlines()]
        self.assertEqual([r["time_us"] for r in recs], [7.5, 1.0])
        self.assertEqual(recs[0]["peer"], "ranktree")
        self.assertEqual(recs[1]["peer"], "ranktree")  # --set overrides
        self.assertEqual(recs[0]["round"], 2)

    def test_nothing_found_fails(self):
        p = self.run_tag("[rank 0] allreduce-bench: joining the job: boom\n")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stdout, "")


class SummarizeTest(unittest.TestCase):
    def recs(self):
        big = 64 << 20
        out = []
        for rnd, (rt, gl, mp) in enumerate([(20e3, 130e3, 300e3), (25e3, 140e3, 320e3), (30e3, 100e3, 310e3)]):
            out += [
                {"peer": "ranktree", "transport": "shm", "bytes": 4, "time_us": 8.0 + rnd, "round": rnd},
                {"peer": "ranktree", "transport": "shm", "bytes": big, "time_us": rt, "round": rnd},
                {"peer": "gloo", "transport": "tcp", "bytes": 4, "time_us": 150.0, "round": rnd},
                {"peer": "gloo", "transport": "tcp", "bytes": big, "time_us": gl, "round": rnd},
                {"peer": "openmpi", "transport": "shm", "bytes": 4, "time_us": 1.0, "round": rnd},
                {"peer": "openmpi", "transport": "shm", "bytes": big, "time_us": mp, "round": rnd},
            ]
        return out

    def test_ratios_and_goals(self):
        res = summarize.build({"world_size": 2}, self.recs(), None)
        rows = {(r["peer"], r["transport"]): r for r in res["rows"]}
        rt = rows[("ranktree", "shm")]
        self.assertEqual(rt["small_latency_us"], 9.0)        # median of 8, 9, 10
        self.assertEqual(rt["large_time_us"], 25e3)          # median over rounds
        self.assertAlmostEqual(rt["ratio_vs_gloo"], 130e3 / 25e3)
        self.assertAlmostEqual(rt["ratio_vs_openmpi"], 310e3 / 25e3)
        self.assertNotIn("ratio_vs_gloo", rows[("gloo", "tcp")])
        goals = {g["goal"]: g["met"] for g in res["goals"]}
        self.assertTrue(goals["64 MiB algbw >= 4x Gloo (shm)"])
        self.assertTrue(goals["64 MiB algbw >= 2x Open MPI (shm)"])
        self.assertTrue(goals["4 B latency <= 10 us (shm)"])

    def test_ratio_uses_peers_best_row(self):
        recs = self.recs() + [
            {"peer": "openmpi", "transport": "shm, --bind-to none", "bytes": 64 << 20, "time_us": 100e3, "round": 0}]
        rt = [r for r in summarize.build({"world_size": 2}, recs, None)["rows"] if r["peer"] == "ranktree"][0]
        self.assertAlmostEqual(rt["ratio_vs_openmpi"], 100e3 / 25e3)

    def test_missed_goal(self):
        recs = [dict(r) for r in self.recs()]
        for r in recs:
            if r["peer"] == "ranktree" and r["bytes"] == 4:
                r["time_us"] = 50.0
        goals = {g["goal"]: g["met"] for g in summarize.build({"world_size": 2}, recs, None)["goals"]}
        self.assertFalse(goals["4 B latency <= 10 us (shm)"])

    def test_sweep(self):
        recs = []
        for rnd, (a, b) in enumerate([(3.0, 1.0), (5.0, 2.0), (4.0, 9.0)]):
            for w in (2, 3):
                recs += [
                    {"peer": "ranktree", "transport": "shm", "bytes": 4, "time_us": a - 1, "mean_us": a * w, "round": rnd, "world": w},
                    {"peer": "openmpi", "transport": "shm", "bytes": 4, "time_us": b, "mean_us": b * w, "round": rnd, "world": w},
                    {"peer": "ranktree", "transport": "shm", "bytes": 8, "time_us": 1, "mean_us": 1, "round": rnd, "world": w},
                    {"peer": "ranktree", "transport": "shm", "bytes": 16, "time_us": 1, "mean_us": 1, "round": rnd, "world": w},
                ]
        res = summarize.build({"world_size": 2}, recs, None)
        self.assertEqual(res["world"], 2)
        self.assertEqual(len(res["records"]), len(recs))
        sw = res["sweep"]
        self.assertEqual(sorted(sw), [2, 3])
        c = sw[3]["rows"][0]["cols"]
        self.assertEqual(c["ranktree/shm"]["mean_us"], 12.0)     # median of 9, 15, 12
        self.assertEqual(c["ranktree/shm"]["mean_us_min"], 9.0)
        self.assertEqual(c["openmpi/shm"]["mean_us"], 6.0)       # median of 3, 6, 27
        self.assertAlmostEqual(c["ranktree/shm"]["vs_openmpi"], 2.0)
        self.assertNotIn("vs_openmpi", sw[2]["rows"][1]["cols"]["ranktree/shm"])
        md = summarize.markdown(res)
        self.assertIn("3 ranks, mean time per allreduce", md)
        self.assertIn("| 4 B | 12.0 (9.0) | 6.0 (3.0) | 2.00x |", md)

    def test_launch_parse(self):
        text = "\n".join([
            "goos: linux",
            "BenchmarkLaunchOverhead/direct-2         \t  900000\t      1300 ns/op\t     336 B/op\t       5 allocs/op",
            "BenchmarkLaunchOverhead/direct-2         \t  900000\t      1100 ns/op\t     336 B/op\t       5 allocs/op",
            "BenchmarkLaunchOverhead/processgroup-2   \t  400000\t      3200 ns/op",
            "BenchmarkLaunchOverhead/processgroup-2   \t  400000\t      3000 ns/op",
            "PASS",
        ]) + "\n"
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "launch.txt")
            with open(p, "w") as f:
                f.write(text)
            res = summarize.parse_launch(p)
        subs = res["BenchmarkLaunchOverhead"]
        self.assertEqual(subs["direct"], 1200)
        self.assertEqual(subs["processgroup"], 3100)
        self.assertAlmostEqual(subs["overhead_us"], 1.9)

    def test_markdown_has_table(self):
        md = summarize.markdown(summarize.build({"world_size": 2}, self.recs(), None))
        self.assertIn("| ranktree | shm | 9.0 | 25.0 |", md)
        self.assertIn("5.20x", md)  # 130/25


if __name__ == "__main__":
    unittest.main()
