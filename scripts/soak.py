#!/usr/bin/env python3
"""Soak test (issue #20): a SWARM-KV (or DM-ABD) store left running.

YCSB-A (50% gets, 50% updates, uniform keys) over one shm cluster of
3 nodes, from `--writers` `swarm kv shell` processes, until the values
written add up to `--factor` times the nodes' total capacity; every
`--kill-every` seconds one shell is killed with SIGKILL and restarted
(it waits for a client id: the killed one frees after its lease, and its
next holder recycles what it left in its log). Meanwhile `swarm memnode
stats` is sampled: the memory the nodes have claimed must stop growing
after warm-up. At the end every key must read its last acknowledged value
(or one whose put was in flight when its shell was killed).

Each key is written by one shell only (keys are dealt among them), so
what a get may return is known exactly: the last acknowledged value, or
after a kill one of the puts that were in flight.

  scripts/soak.py                      # 20x of 3 x 64 MiB in 1000 B values
  scripts/soak.py --factor 2 --kill-every 5   # a quick one

Prints a memory timeline and one verdict line; exits 1 on any error,
wrong value or memory growth after warm-up.
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWARM = os.path.join(ROOT, "target", "release", "swarm")
BATCH = 24  # commands in flight per shell (their bytes fit the pipes' buffers)


def swarm(*args, check=True):
    out = subprocess.run([SWARM, *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        sys.exit(f"soak: swarm {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


class Writer(threading.Thread):
    """One shell at a time, owning keys k with k % writers == index."""

    def __init__(self, index, opts, keys, budget, stop):
        super().__init__(daemon=True)
        self.index, self.opts, self.keys, self.budget, self.stop = index, opts, keys, budget, stop
        self.acked = {}  # key -> last acknowledged value
        self.maybe = {}  # key -> values whose put was in flight at a kill
        self.proc = None
        self.lock = threading.Lock()
        self.puts = self.gets = self.restarts = self.written = 0
        self.errors = []
        self.seq = 0
        self.rng = random.Random(index)

    def value(self, key):
        self.seq += 1
        head = f"{self.index}-{key}-{self.seq:012d}-"
        return head + "x" * (self.opts.value_size - len(head))

    def spawn(self):
        with self.lock:
            self.proc = subprocess.Popen(
                [SWARM, "kv", "--dir", self.opts.dir, "shell"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1 << 16,
            )

    def kill(self):
        with self.lock:
            if self.proc and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)

    def check_get(self, key, got):
        want = self.acked.get(key)
        if got == want:
            self.maybe.pop(key, None)
            return
        if got in self.maybe.get(key, ()):
            self.acked[key] = got
            self.maybe.pop(key)
            return
        self.errors.append(f"get {key}: {got[:40]!r}..., expected {str(want)[:40]!r}...")

    def batch(self, first):
        """One batch of commands: the initial puts of every key, or YCSB-A."""
        cmds = []
        for _ in range(BATCH):
            if first:
                if not self.todo:
                    break
                key = self.todo.pop()
                cmds.append(("put", key, self.value(key)))
            else:
                key = self.rng.choice(self.keys)
                if self.rng.random() < 0.5:
                    cmds.append(("get", key, None))
                else:
                    cmds.append(("put", key, self.value(key)))
        return cmds

    def run(self):
        self.todo = list(self.keys)
        self.spawn()
        while not self.stop.is_set() and self.written < self.budget:
            loading = bool(self.todo)
            cmds = self.batch(loading)
            text = "".join(f"put {k} {v}\n" if op == "put" else f"get {k}\n" for op, k, v in cmds)
            answered = 0
            try:
                self.proc.stdin.write(text)
                self.proc.stdin.flush()
                for op, key, v in cmds:
                    line = self.proc.stdout.readline()
                    if not line:
                        raise BrokenPipeError
                    line = line.rstrip("\n")
                    answered += 1
                    if line.startswith("error: cannot keep the client id"):
                        self.errors.append(line)
                        line = self.proc.stdout.readline().rstrip("\n")
                    if op == "put":
                        if line == "OK":
                            self.acked[key] = v
                            self.maybe.pop(key, None)
                            self.puts += 1
                            self.written += len(v)
                        else:
                            self.errors.append(f"put {key}: {line}")
                    else:
                        self.gets += 1
                        self.check_get(key, line)
            except (BrokenPipeError, OSError, ValueError):
                # Killed: the puts not answered may or may not have landed.
                for op, key, v in cmds[answered:]:
                    if op == "put":
                        self.maybe.setdefault(key, []).append(v)
                        if loading and key not in self.acked:
                            self.todo.append(key)
                self.proc.wait()
                self.restarts += 1
                self.spawn()
        with self.lock:
            self.proc.stdin.close()
            self.proc.wait()


def stats(opts):
    """Per node: (live, reclaimable, free) bytes, from `swarm memnode stats`."""
    out = swarm("memnode", "stats", "--dir", opts.dir)
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    rows = []
    for line in out.splitlines()[1:]:
        c = line.split()
        # node N SIZE U LIVE U (%) RECL U (%) POOLED U FREE U (%) segs back ids
        b = lambda i: float(c[i]) * units[c[i + 1]]
        rows.append((b(4), b(7), b(12)))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="/dev/shm/swarm-soak")
    p.add_argument("--system", default="swarm-kv")
    p.add_argument("--size", default="64M")
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--value-size", type=int, default=1000)
    p.add_argument("--writers", type=int, default=2)
    p.add_argument("--factor", type=float, default=20)
    p.add_argument("--kill-every", type=float, default=15)
    p.add_argument("--sample-every", type=float, default=5)
    opts = p.parse_args()
    if not os.access(SWARM, os.X_OK):
        sys.exit(f"soak: build it first: cargo build --release -p swarm-cli ({SWARM})")

    swarm("memnode", "remove", "--dir", opts.dir, check=False)
    swarm("memnode", "create", "--dir", opts.dir, "--nodes", "3", "--size", opts.size, "--max-value", "1K")
    swarm(
        "kv", "--dir", opts.dir, "init", "--system", opts.system, "--keys", str(opts.keys),
        "--max-value", "1K", "--writers", str(opts.writers), "--lease", "1s",
    )
    capacity = 3 * sum(r[0] + r[1] + r[2] for r in stats(opts)[:1])
    budget = opts.factor * capacity / opts.writers
    print(f"soak: {opts.system}, 3 nodes of {opts.size}, {opts.keys} keys of {opts.value_size} B, "
          f"{opts.writers} shells; writing {opts.factor:g} x {capacity / 2**20:.0f} MiB in values", flush=True)

    stop = threading.Event()
    keys = [f"k{i}" for i in range(opts.keys)]
    writers = [Writer(i, opts, keys[i :: opts.writers], budget, stop) for i in range(opts.writers)]
    began = time.time()
    for w in writers:
        w.start()
    samples, next_kill, victim, kills = [], began + opts.kill_every, 0, 0
    while any(w.is_alive() for w in writers):
        time.sleep(min(opts.sample_every, 1.0))
        now = time.time()
        if not samples or now - samples[-1][0] - began >= opts.sample_every:
            rows = stats(opts)
            written = sum(w.written for w in writers)
            claimed = max(r[0] + r[1] for r in rows)
            samples.append((now - began, written, claimed, max(r[0] for r in rows)))
            t, wr, cl, live = samples[-1]
            print(f"  {t:6.0f} s  written {wr / capacity:5.2f}x  claimed {cl / 2**20:6.1f} MiB  "
                  f"live {live / 2**20:6.1f} MiB  (fullest node)", flush=True)
        if opts.kill_every > 0 and now >= next_kill:
            writers[victim % len(writers)].kill()
            victim += 1
            kills += 1
            next_kill = now + opts.kill_every
    stop.set()

    # Every key reads its last acknowledged value.
    wrong = []
    reader = subprocess.run(
        [SWARM, "kv", "--dir", opts.dir, "shell"],
        input="".join(f"get {k}\n" for k in keys), capture_output=True, text=True,
    )
    got = reader.stdout.splitlines()
    for w in writers:
        for k in w.keys:
            line = got[keys.index(k)] if keys.index(k) < len(got) else None
            if line != w.acked.get(k) and line not in w.maybe.get(k, ()):
                wrong.append(k)
    errors = [e for w in writers for e in w.errors]
    puts, gets = sum(w.puts for w in writers), sum(w.gets for w in writers)
    restarts = sum(w.restarts for w in writers)
    took = time.time() - began
    # Flat after warm-up: the memory claimed in the last half of the run
    # is what it was at the half.
    half = [s for s in samples if s[1] >= samples[-1][1] / 2]
    grew = half[-1][2] - half[0][2] if len(half) > 1 else 0
    print(f"soak: {puts} puts, {gets} gets, {kills} shells killed ({restarts} restarts) in {took:.0f} s; "
          f"claimed {samples[-1][2] / 2**20:.1f} MiB of {opts.size} at the end, "
          f"{grew / 2**20:+.1f} MiB over the second half; {len(errors)} errors; {len(wrong)} keys wrong")
    for e in errors[:5]:
        print(f"  error: {e}")
    for k in wrong[:5]:
        print(f"  wrong: {k}")
    if errors or wrong or grew > 0:
        sys.exit(1)
    swarm("memnode", "remove", "--dir", opts.dir)


if __name__ == "__main__":
    main()
