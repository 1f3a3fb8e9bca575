"""Unit tests of the bench-compare helpers (no peers, no ranks needed).

    /usr/bin/python3 -m unittest discover -s scripts/bench -p 'test_*.py'

(or /usr/bin/python3 -m pytest scripts/bench where pytest is installed).
The MPI test needs numpy (Debian's /usr/bin/python3 has it); nothing here
starts a rank, mpirun or torch.distributed.
"""

import io
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import gloo_allreduce  # noqa: E402
import mpi_allreduce  # noqa: E402
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
        self.assertEqual((r["mean_us"], r["p50_us"], r["p90_us"], r["p99_us"]), (5.5, 5.5, 9.0, 10.0))
        r = common.result("openmpi", "shm", 2, 4, [float(x) for x in range(1, 201)])
        self.assertEqual((r["p90_us"], r["p99_us"]), (180.0, 198.0))  # the same ranks as allreduce-bench's Summarize
        r4 = common.result("gloo", "tcp", 4, 64 << 20, [2000.0])
        self.assertAlmostEqual(r4["busbw_GBps"], r4["algbw_GBps"] * 1.5, places=5)
        self.assertEqual((r4["collective"], r4["req_bytes"], r4["redop"]), ("allreduce", 64 << 20, "sum"))

    def test_layout_as_allreduce_bench(self):
        # the float32 cases of allreduce-bench's TestLayout (collective_test.go)
        self.assertEqual(common.layout("allreduce", 4096, 3), (1024, 1024, 0))
        self.assertEqual(common.layout("allreduce", 2, 2), (1, 1, 0))
        self.assertEqual(common.layout("allgather", 4096, 3), (1023, 341, 1023))
        self.assertEqual(common.layout("allgather", 4, 4), (4, 1, 4))
        self.assertEqual(common.layout("reducescatter", 4096, 4), (1024, 1024, 256))
        self.assertEqual(common.layout("broadcast", 40, 4), (10, 10, 0))
        with self.assertRaises(ValueError):
            common.layout("gather", 4, 2)
        self.assertAlmostEqual(common.bus_factor("allreduce", 4), 1.5)
        self.assertAlmostEqual(common.bus_factor("allgather", 4), 0.75)
        self.assertAlmostEqual(common.bus_factor("reducescatter", 3), 2.0 / 3)
        self.assertEqual(common.bus_factor("broadcast", 8), 1.0)

    def test_result_of_other_collectives(self):
        r = common.result("openmpi", "shm", 3, 4096, [1.0], "allgather")
        self.assertEqual((r["req_bytes"], r["bytes"], r["count"], r["redop"]), (4096, 4092, 1023, "none"))
        self.assertAlmostEqual(r["busbw_GBps"], r["algbw_GBps"] * 2 / 3, places=5)
        r = common.result("openmpi", "shm", 3, 8, [1.0], "reducescatter")
        self.assertEqual((r["req_bytes"], r["bytes"], r["redop"]), (8, 12, "sum"))
        r = common.result("openmpi", "shm", 4, 4096, [1.0], "broadcast")
        self.assertEqual((r["bytes"], r["busbw_GBps"]), (4096, r["algbw_GBps"]))


class LoopTest(unittest.TestCase):
    def test_time_loop(self):
        ev = []
        clock = iter(range(0, 10 ** 6, 500))  # 0.5 µs per reading
        times = common.time_loop(lambda: ev.append("op"), 2, 3, lambda: ev.append("barrier"), lambda: next(clock))
        self.assertEqual(ev, ["op", "op", "barrier", "op", "op", "op"])
        self.assertEqual(times, [0.5, 0.5, 0.5])

    def test_measure_all(self):
        args = common.arg_parser("x").parse_args(["--sizes", "4,2MiB", "--iters", "4", "--warmup", "1",
                                                  "--large-iters", "2", "--large-warmup", "0",
                                                  "--collective", "allgather"])
        made, seen = [], []

        def max_reduce(ts):
            seen.append(len(ts))
            return [10.0] * len(ts)

        def run(lead):
            buf = io.StringIO()
            with redirect_stdout(buf):
                common.measure_all(args, 2, lead, lambda s: made.append(s) or (lambda: None),
                                   lambda: None, max_reduce, "p", "t", {"x": 1})
            return [json.loads(x) for x in buf.getvalue().splitlines()]

        recs = run(True)
        self.assertEqual(made, [4, 2 << 20])
        self.assertEqual(seen, [4, 2])  # small and large iteration counts
        self.assertEqual([(r["req_bytes"], r["bytes"], r["collective"], r["mean_us"], r["x"]) for r in recs],
                         [(4, 8, "allgather", 10.0, 1), (2 << 20, 2 << 20, "allgather", 10.0, 1)])
        self.assertEqual(run(False), [])  # only the lead rank prints


class PeerTest(unittest.TestCase):
    def test_mpi_calls(self):
        import numpy as np
        calls = []

        class Comm:
            def Get_size(self):
                return 3

            def __getattr__(self, name):
                return lambda *a, **k: calls.append((name, [x.size for x in a if hasattr(x, "size")], k))

        mpi = types.SimpleNamespace(IN_PLACE="inplace", SUM="sum")
        for coll in common.COLLECTIVES:
            mpi_allreduce.make_op(Comm(), mpi, np, coll, 4096)()
        self.assertEqual(calls, [
            ("Allreduce", [1024], {"op": "sum"}),
            ("Allgather", [341, 1023], {}),
            ("Reduce_scatter_block", [1023, 341], {"op": "sum"}),
            ("Bcast", [1024], {"root": 0}),
        ])

    def test_gloo_pick_call(self):
        ran = []

        def refuse(*a, **k):
            raise RuntimeError("no support for _allgather_base in Gloo process group")

        dist = types.SimpleNamespace(all_gather_into_tensor=refuse, ReduceOp=types.SimpleNamespace(SUM="sum"),
                                     all_gather=lambda outs, inp: ran.append(len(outs)),
                                     reduce_scatter_tensor=refuse, reduce_scatter=refuse,
                                     broadcast=lambda t, src: ran.append("b"))
        api, call = gloo_allreduce.pick_call(dist, FakeTorch(), "allgather", 2)
        self.assertEqual(api, "all_gather into n views (refused: all_gather_into_tensor: "
                              "no support for _allgather_base in Gloo process group)")
        self.assertEqual(ran, [2])
        api, why = gloo_allreduce.pick_call(dist, FakeTorch(), "reducescatter", 2)
        self.assertIsNone(api)
        self.assertIn("torch 1.13.0a0's Gloo refuses it: reduce_scatter_tensor: no support", why)
        self.assertIn("reduce_scatter over n views: no support", why)
        api, _ = gloo_allreduce.pick_call(dist, FakeTorch(), "broadcast", 2)
        self.assertEqual(api, "broadcast")


class FakeTorch:
    """torch's zeros/float32/__version__, with tensors whose chunk() splits a list."""

    __version__, float32 = "1.13.0a0", "f32"

    def zeros(self, n, dtype):
        return FakeTensor(n)


class FakeTensor(list):
    def __init__(self, n):
        super().__init__([0.0] * n)

    def chunk(self, k):
        m = len(self) // k
        return [self[i * m:(i + 1) * m] for i in range(k)]


class TagTest(unittest.TestCase):
    def run_tag(self, text, *sets):
        args = [sys.executable, os.path.join(HERE, "tag.py")]
        sets = list(sets)
        while sets:
            s = sets.pop(0)
            args += [s, sets.pop(0)] if s.startswith("--") else ["--set", s]
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

    def test_late_and_unsupported_records(self):
        text = "\n".join([
            '[rank 0] {"collective":"allreduce","req_bytes":4,"bytes":4,"wake_us":12.0,"wait_cpu_pct":3.0}',
            '{"peer":"gloo","collective":"reducescatter","unsupported":"refused"}',
            '{"peer":"gloo","collective":"reducescatter"}',
        ]) + "\n"
        p = self.run_tag(text, "peer=x")
        self.assertEqual(p.returncode, 0, p.stderr)
        recs = [json.loads(x) for x in p.stdout.splitlines()]
        self.assertEqual([sorted(r) for r in recs], [
            ["bytes", "collective", "peer", "req_bytes", "wait_cpu_pct", "wake_us"],
            ["collective", "peer", "unsupported"]])

    def test_req_bytes_from_sizes(self):
        # an older allreduce-bench: no req_bytes; allgather of 4 and 8 B on 3
        # ranks both use 12 B, 4 KiB uses 4092 B; 16 B failed (missing)
        text = "".join('[rank 0] {"collective":"allgather","bytes":%d,"time_us":1}\n' % b for b in (12, 12, 4092))
        text += '[rank 0] {"collective":"allgather","req_bytes":64,"bytes":63,"time_us":1}\n'
        p = self.run_tag(text, "world=3", "--sizes", "4,8,16,4KiB")
        recs = [json.loads(x) for x in p.stdout.splitlines()]
        self.assertEqual([r["req_bytes"] for r in recs], [4, 8, 4096, 64])
        p = self.run_tag('{"bytes":12,"time_us":1}\n')
        self.assertEqual(json.loads(p.stdout)["req_bytes"], 12)  # no --sizes: the bytes

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
        self.assertTrue(goals["4 B latency (mean) <= 10 us (shm)"])

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
        self.assertFalse(goals["4 B latency (mean) <= 10 us (shm)"])

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
        self.assertEqual([(t["collective"], t["world"]) for t in sw], [("allreduce", 2), ("allreduce", 3)])
        c = sw[1]["rows"][0]["cols"]
        self.assertEqual(c["ranktree/shm"]["mean_us"], 12.0)     # median of 9, 15, 12
        self.assertEqual(c["ranktree/shm"]["mean_us_min"], 9.0)
        self.assertEqual(c["openmpi/shm"]["mean_us"], 6.0)       # median of 3, 6, 27
        self.assertAlmostEqual(c["ranktree/shm"]["vs_openmpi"], 2.0)
        self.assertAlmostEqual(c["openmpi/shm"]["spread"], 2.0)  # 6 / 3: flagged
        self.assertNotIn("vs_openmpi", sw[0]["rows"][1]["cols"]["ranktree/shm"])
        md = summarize.markdown(res)
        self.assertIn("allreduce, 3 ranks: mean time per op in us", md)
        self.assertIn("| 4 B | 12.0 (9.00) | 6.00 (3.00) | 2.00x |", md)
        # stability: openmpi's 4 B cell (median 2, best 1 at 2 ranks; 6 / 3 at 3) is flagged
        st = res["stability"]
        self.assertEqual(st["cells"], 8)
        self.assertEqual(sorted((f[1], f[2], f[3]) for f in st["flagged"]), [(2, "openmpi/shm", 4), (3, "openmpi/shm", 4)])
        self.assertIn("2 of 8 cells above 1.5x", md)
        self.assertIn("**6.00 / 3.00 = 2.00x !**", md)
        self.assertIn("| 4 B | 12.0 / 9.00 = 1.33x |", md)

    def collective_recs(self):
        """allgather and broadcast on 3 ranks, ranktree and Open MPI, 3 rounds;
        allgather of 4 and 8 B both use 12 B; Gloo cannot reducescatter."""
        out = []
        for rnd in range(3):
            for peer, f in (("ranktree", 3.0), ("openmpi", 1.0)):
                for req, used in ((4, 12), (8, 12), (4096, 4092)):
                    out.append({"peer": peer, "transport": "shm", "collective": "allgather", "world": 3, "round": rnd,
                                "req_bytes": req, "bytes": used, "time_us": f, "mean_us": f * (2 if req == 8 else 1),
                                "p50_us": f / 2, "p90_us": f * 4, "p99_us": f * 8})
                out.append({"peer": peer, "transport": "shm", "collective": "broadcast", "world": 3, "round": rnd,
                            "req_bytes": 4096, "bytes": 4096, "time_us": 1.0, "mean_us": 1.0 + rnd})
        out.append({"peer": "gloo", "collective": "reducescatter", "world": 3, "round": 0, "transport": "tcp",
                    "unsupported": "torch 1.13's Gloo refuses it"})
        out.append({"peer": "gloo", "transport": "tcp", "collective": "allgather", "world": 3, "round": 0,
                    "req_bytes": 4, "bytes": 12, "time_us": 500.0, "api": "all_gather into n views (refused: x)"})
        return out

    def test_collectives(self):
        res = summarize.build({"world_size": 3}, self.collective_recs(), None)
        self.assertEqual(res["rows"], [])  # no allreduce: no summary rows
        sw = {(t["collective"], t["world"]): t for t in res["sweep"]}
        self.assertEqual(sorted(sw), [("allgather", 3), ("broadcast", 3)])
        rows = sw[("allgather", 3)]["rows"]
        self.assertEqual([(r["bytes"], r["used_bytes"]) for r in rows], [(4, 12), (8, 12), (4096, 4092)])
        self.assertEqual(rows[1]["cols"]["ranktree/shm"]["mean_us"], 6.0)  # 8 B kept apart from 4 B
        self.assertEqual(rows[1]["cols"]["ranktree/shm"]["rounds"], 3)
        self.assertAlmostEqual(rows[0]["cols"]["ranktree/shm"]["vs_openmpi"], 3.0)
        self.assertEqual((rows[0]["cols"]["ranktree/shm"]["p50_us"], rows[0]["cols"]["ranktree/shm"]["p90_us"]), (1.5, 12.0))
        goals = {g["goal"]: g for g in res["goals15"]}
        g = goals["allgather, 3 ranks, shm: <= Open MPI from 4 KiB, <= 2x below"]
        self.assertFalse(g["met"])
        self.assertEqual(g["value"], "below 4 KiB worst 3.00x at 4 B; from 4 KiB worst 3.00x at 4 KiB")
        self.assertTrue(goals["broadcast, 3 ranks, shm: <= Open MPI from 4 KiB, <= 2x below"]["met"])
        md = summarize.markdown(res)
        self.assertIn("### allgather", md)
        self.assertNotIn("## Summary", md)  # no allreduce measured
        self.assertIn("| 8 B (12 B) | 6.00 (6.00) | - | 2.00 (2.00) | 3.00x |", md)
        self.assertIn("| 4 B (12 B) | 1.50 / 12.0 / 24.0 | 500.0 / - / - | 0.50 / 4.00 / 8.00 |", md)  # p50 / p90 / p99
        self.assertIn("- gloo reducescatter: not measured: torch 1.13's Gloo refuses it", md)
        self.assertIn("- gloo allgather: measured with all_gather into n views (refused: x)", md)
        self.assertIn("broadcast, 3 ranks: median / best", md)
        self.assertIn("**2.00 / 1.00 = 2.00x !**", md)  # broadcast means 1, 2, 3

    def test_mean_is_the_headline(self):
        recs = []
        for rnd, (med, mean) in enumerate([(2.0, 30.0), (2.5, 10.0), (3.0, 20.0)]):
            recs.append({"peer": "ranktree", "transport": "shm", "bytes": 4, "time_us": med, "p50_us": med,
                         "mean_us": mean, "p90_us": 4 * med, "round": rnd})
        res = summarize.build({"world_size": 2}, recs, None)
        row = res["rows"][0]
        self.assertEqual((row["small_latency_us"], row["small_p50_us"], row["small_p90_us"]), (20.0, 2.5, 10.0))
        self.assertEqual(row["small_latency_us_rounds"], [30.0, 10.0, 20.0])
        goals = {g["goal"]: g for g in res["goals"]}
        self.assertFalse(goals["4 B latency (mean) <= 10 us (shm)"]["met"])  # the medians would pass
        self.assertIn("| ranktree | shm | 20.00 | 2.50 / 10.00 |", summarize.markdown(res))

    def test_late_figures(self):
        # 2 ranks, rank 1 late; per iteration [launch, return, cpu] of each rank (ns)
        rows = [
            [0, 10_000, 1_000, 8_000, 9_000, 500],      # waiting rank 0 returns 2 us after rank 1's launch
            [0, 20_000, 4_000, 15_000, 16_000, 500],    # 5 us after
            [0, 30_000, 3_000, 24_000, 26_000, 500],    # 6 us after
        ]
        f = common.late_figures(rows, 2, 1)
        self.assertAlmostEqual(f["wait_cpu_pct"], 10.0)   # 1/10, 4/20, 3/30 of the waits: 10, 20, 10 %
        self.assertAlmostEqual(f["wait_cpu_pct_max"], 20.0)
        self.assertEqual(f["wake_us"], 5.0)
        self.assertEqual((f["wake_us_min"], f["wake_us_max"]), (2.0, 6.0))
        self.assertEqual(f["late_op_us"], 1.0)
        self.assertEqual((f["lag_us"], f["lag_us_min"]), (4.0, 1.0))
        self.assertAlmostEqual(f["wait_cpu_pct_all"], 100.0 * 8_000 / 60_000)

    def test_c2c_state(self):
        # The probe's value per run: ranktree's small and large runs of a
        # round share nothing; a record without it (a failed probe) is
        # left out; the late-arrival records get a row of their own.
        def rec(peer, rnd, c2c, size=4, **kw):
            r = {"peer": peer, "transport": "shm", "collective": "allreduce", "world": 2, "bytes": size,
                 "mean_us": 1.0, "time_us": 1.0, "round": rnd, **kw}
            if c2c is not None:
                r["c2c_ns"] = c2c
            return r
        recs = [rec("ranktree", 1, 55, c2c_run=1), rec("ranktree", 1, 55, size=8, c2c_run=1),
                rec("ranktree", 1, 60, size=1 << 20, c2c_run=2),
                rec("ranktree", 2, 320, c2c_run=5), rec("ranktree", 2, 320, size=1 << 20, c2c_run=6),
                rec("openmpi", 1, 61, c2c_run=3), rec("openmpi", 2, None)]
        late = [rec("ranktree", 1, 330, wake_us=9.0)]
        res = summarize.build({"world_size": 2}, recs, None, None, late)
        rows = {(r["peer"], r["collective"]): r for r in res["c2c"]}
        rt = rows[("ranktree", "allreduce")]
        self.assertEqual(rt["rounds"], [[55, 60], [320, 320]])  # two runs, equal values
        self.assertEqual((rt["far"], rt["runs"]), (2, 4))
        self.assertEqual(rows[("openmpi", "allreduce")]["rounds"], [[61]])
        lt = rows[("ranktree", "allreduce (late arrival)")]
        self.assertEqual((lt["far"], lt["runs"]), (1, 1))
        md = summarize.markdown(res)
        self.assertIn("## The host's state before each run", md)
        self.assertIn("| ranktree | shm | allreduce | 2 | 55, 60; 320*, 320* | 2 of 4 |", md)
        # no probe anywhere: no section
        plain = summarize.build({"world_size": 2}, [rec("ranktree", 1, None)], None)
        self.assertEqual(plain["c2c"], [])
        self.assertNotIn("host's state", summarize.markdown(plain))

    def test_goals15(self):
        recs = []
        for rnd in range(3):
            for size, rt, mpi, gloo in ((4, 2.0, 1.0, 100.0), (64 << 20, 5000.0 + rnd * 100, 25000.0 + rnd * 5000, 40000.0)):
                recs += [
                    {"peer": "ranktree", "transport": "shm", "bytes": size, "time_us": rt, "mean_us": rt, "round": rnd, "world": 2},
                    {"peer": "openmpi", "transport": "shm", "bytes": size, "time_us": mpi, "mean_us": mpi, "round": rnd, "world": 2},
                    {"peer": "gloo", "transport": "tcp", "bytes": size, "time_us": gloo, "mean_us": gloo, "round": rnd, "world": 2},
                ]
            recs.append({"peer": "ranktree", "transport": "tcp", "bytes": 4, "time_us": 15.0, "mean_us": 15.0 + rnd, "round": rnd, "world": 2})
        late = [{"peer": "ranktree", "transport": "shm", "world": 2, "round": 1, "collective": "allreduce",
                 "req_bytes": s, "bytes": s, "late_rank": 1, "late_us": 5000, "wait_cpu_pct": cpu,
                 "wait_cpu_pct_max": cpu * 2, "wake_us": wake, "wake_us_min": 1, "wake_us_max": 90, "lag_us": 3}
                for s, cpu, wake in ((4, 5.0, 12.0), (4096, 60.0, 30.0))]
        res = summarize.build({"world_size": 2}, recs, None, late=late)
        g = {x["goal"]: x for x in res["goals15"]}
        x = g["allreduce, 2 ranks, shm: mean <= Open MPI's at every size"]
        self.assertEqual((x["value"], x["met"]), ("1 of 2 sizes; worst 2.00x at 4 B", False))
        x = g["stable: median of the rounds <= 1.5x the best, every size (allreduce, 2 ranks, shm)"]
        self.assertEqual((x["value"], x["met"]), ("worst 1.02x at 64 MiB (3 rounds); Open MPI's own worst 1.20x at 64 MiB", True))
        x = g["tcp: 4 B allreduce mean <= 20 us (2 ranks)"]
        self.assertEqual((x["value"], x["met"]), ("16.0 us", True))
        x = g["64 MiB allreduce algbw >= 6.5x Gloo (2 ranks, shm)"]
        self.assertEqual((x["value"], x["met"]), ("7.84x", True))  # 40000 / 5100
        x = g["late rank (5000 us): waiting rank's CPU <= 10% of a core"]
        self.assertEqual((x["value"], x["met"]), ("worst 60.0% at 4 KiB", False))
        x = g["late rank (5000 us): waiting rank returns <= 20 us after its arrival"]
        self.assertEqual((x["value"], x["met"]), ("worst 30.0 us at 4 KiB (median over iterations)", False))
        md = summarize.markdown(res)
        self.assertIn("## Late arrival", md)
        self.assertIn("| ranktree | 4 KiB | 60.0 (120.0) | 30.0 (1.00-90.0) | 3.00 | - | 1 |", md)
        self.assertIn("5000 us late, asleep in between (allreduce-bench --late-rank).", md)
        for r in late:
            r["late_busy"] = True
            r["late_op_us"] = 27.0
        md = summarize.markdown(summarize.build({"world_size": 2}, recs, None, late=late))
        self.assertIn("5000 us late, busy in between (allreduce-bench --late-rank --late-busy).", md)
        self.assertIn("| ranktree | 4 KiB | 60.0 (120.0) | 30.0 (1.00-90.0) | 3.00 | 27.0 | 1 |", md)
        # Open MPI's late rows sit beside ranktree's, and the goals stay ranktree's
        mpi = [dict(r, peer="openmpi", wait_cpu_pct=100.0, wait_cpu_pct_max=100.2, wake_us=70.0, late_op_us=55.0) for r in late]
        res = summarize.build({"world_size": 2}, recs, None, late=mpi + late)
        self.assertEqual([r["peer"] for r in res["late"]], ["ranktree", "ranktree", "openmpi", "openmpi"])
        g = {x["goal"]: x for x in res["goals15"]}
        self.assertEqual(g["late rank (5000 us): waiting rank's CPU <= 10% of a core"]["value"], "worst 60.0% at 4 KiB")
        md = summarize.markdown(res)
        self.assertIn("| openmpi | 4 B | 100.0 (100.2) | 70.0 (1.00-90.0) | 3.00 | 55.0 | 1 |", md)
        self.assertIn("Open MPI's rows: mpi_allreduce.py --late-rank", md)
        # sizes above GOAL15_LATE_MAX_BYTES are listed but not judged
        big = late + [dict(late[0], req_bytes=64 << 20, bytes=64 << 20, wait_cpu_pct=61.0, wake_us=8000.0)]
        res = summarize.build({"world_size": 2}, recs, None, late=big)
        g = {x["goal"]: x for x in res["goals15"]}
        x = g["late rank (5000 us): waiting rank returns <= 20 us after its arrival"]
        self.assertEqual((x["value"], x["met"]), ("worst 30.0 us at 4 KiB (median over iterations); sizes above 64 KiB not judged "
                                                  "(the op's own transfer is in the figures)", False))
        self.assertIn("| ranktree | 64 MiB | 61.0", summarize.markdown(res))
        g = {x["goal"]: x for x in summarize.build({"world_size": 2}, recs, None, late=big[2:])["goals15"]}
        x = g["late rank (5000 us): waiting rank's CPU <= 10% of a core"]
        self.assertEqual((x["value"], x["met"]), ("no size up to 64 KiB measured", None))
        # one round: stability cannot be judged
        one = [r for r in recs if r["round"] == 0]
        g = {x["goal"]: x for x in summarize.build({"world_size": 2}, one, None)["goals15"]}
        self.assertIsNone(g["stable: median of the rounds <= 1.5x the best, every size (allreduce, 2 ranks, shm)"]["met"])

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
        self.assertIn("| ranktree | shm | 9.00 | 9.00 / - | 25.00 | 2.684 |", md)
        self.assertIn("5.20x", md)  # 130/25


if __name__ == "__main__":
    unittest.main()


class ABSummaryTest(unittest.TestCase):
    """scripts/bench/ab_summary.py: bench-ab.sh's runs classed by the host's state."""

    @staticmethod
    def rec(peer, rnd, run, c2c, b, mean):
        return {"peer": peer, "round": rnd, "c2c_run": run, "c2c_ns": c2c, "bytes": b, "mean_us": mean}

    def sample(self):
        r = self.rec
        return [
            # round 1, near: b wins 4 B, a wins 64 B
            r("a", 1, 1, 50, 4, 1.0), r("a", 1, 1, 50, 64, 1.5),
            r("b", 1, 2, 60, 4, 0.9), r("b", 1, 2, 60, 64, 1.6),
            # round 2: a near, b far (probe 150 = 3x the smallest, 50)
            r("b", 2, 3, 150, 4, 2.0), r("b", 2, 3, 150, 64, 2.5),
            r("a", 2, 4, 55, 4, 1.2), r("a", 2, 4, 55, 64, 1.4),
            # round 3: only a (b's run failed): no winner counted
            r("a", 3, 5, 52, 4, 0.8),
        ]

    def test_load_skips_runs_without_a_probe(self):
        import ab_summary
        lines = [json.dumps(self.rec("a", 1, 1, 50, 4, 1.0)), "",
                 json.dumps(dict(self.rec("a", 1, 2, 0, 4, 1.0))),
                 json.dumps({"peer": "a", "round": 1, "c2c_run": 3, "c2c_ns": 50, "bytes": 4})]
        self.assertEqual(len(ab_summary.load(lines)), 1)

    def test_classify_at_the_threshold(self):
        import ab_summary
        states = {(r["peer"], r["round"]): r["state"] for r in ab_summary.classify(self.sample())}
        self.assertEqual(states[("b", 2)], "far")  # exactly FAR_C2C x the smallest
        self.assertEqual(states[("a", 2)], "near")
        self.assertEqual(states[("b", 1)], "near")

    def test_wins_only_rounds_every_peer_ran(self):
        import ab_summary
        w = ab_summary.wins(self.sample(), ["a", "b"])
        self.assertEqual(w[4], {"a": 1, "b": 1})  # round 1 b, round 2 a, round 3 incomplete
        self.assertEqual(w[64], {"a": 2, "b": 0})

    def test_markdown_medians_per_state(self):
        import ab_summary
        md = "\n".join(ab_summary.markdown(self.sample(), "t"))
        near = md[md.index("### near"):md.index("### far")]
        far = md[md.index("### far"):md.index("### rounds")]
        self.assertIn("runs: a 3, b 1", near)
        self.assertIn("| 4 B | 1.00 (0.80) | 0.90 (0.90) |", near)  # a: median of 1.0, 1.2, 0.8
        self.assertIn("| 64 B | 1.45 (1.40) | 1.60 (1.60) |", near)
        self.assertIn("| 4 B | - | 2.00 (2.00) |", far)
        self.assertIn("| 64 B | 2 | 0 |", md)
        self.assertIn("at least 3.0× the smallest (50 ns)", md)
