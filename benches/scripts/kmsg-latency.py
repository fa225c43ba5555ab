#!/usr/bin/env python3
"""kmsg write -> FaultEvent latency of a running gpuwatch agent (target:
p99 < 1 ms), measured against the REAL /dev/kmsg. Needs root.

Two readers of the same records, side by side in one run:

1. kernel floor: a minimal reader (poll(2) + read(2) on /dev/kmsg, nothing
   else) timestamps each record as it gets it. This is what ANY sleeping
   /dev/kmsg reader can achieve: the kernel wakes /dev/kmsg readers from a
   *lazy* irq_work (printk.c `wake_up_klogd_work = IRQ_WORK_INIT_LAZY(...)`),
   which runs on the next scheduler tick of the CPU that logged the record,
   i.e. up to 1/HZ later (4 ms at HZ=250, 1 ms at HZ=1000).
2. agent: `gpuwatch run --sink stdout --accept-user-facility --no-nvml
   --prometheus` on a fresh state directory; once it is ready (it first reads
   the whole ring) COUNT XID 31 records are written, each naming its own PCI
   address (a per-run random base + i: the engine's dedup never coalesces two
   of them and records left in the ring by earlier runs never match). A
   separate reader process timestamps each chunk of the agent's stdout as soon
   as read(2) returns, so writing a burst never delays the read side.
   Latency = JSON line read - record written: kernel ring and wake-up, the
   agent's read, parse, classification, channel, engine, stdout sink, pipe.
   The record's kernel timestamp (in the JSON as monotonic_usec) splits it into
   write -> in ring and in ring -> event. The agent's own read -> emitted
   histogram (`gpuwatch_pipeline_latency_seconds`, /metrics) is scraped before
   and after, and the difference reported.

Both read every record: the bare reader is started (at the ring's end) once
the agent is ready. Each record's bare-reader time is its floor, and
`agent - bare` per record is what the agent itself adds (read, parse,
engine, sink, pipe, the stdout reader's wake-up) whatever the record's
position relative to the kernel's tick — two separate runs differ by their
tick phase by up to 1/HZ, more than the agent's whole cost. On few CPUs the
readers compete for them; that shows in the difference too.

The run holds an exclusive flock(2) on /tmp/gpuwatch-dev-kmsg.lock, the lock
the test suite's /dev/kmsg writers take: a test's agent reads every record
written while it runs, and 2000 foreign XIDs would move the verdicts it
asserts on; a test writing meanwhile would add records to ours.

Writes are timestamped with CLOCK_MONOTONIC just before write(2). printk_devkmsg
is set to `on` for the run (the default `ratelimit` silently drops all but ~10
writes per 5 s of one open file) and restored afterwards, also on Ctrl-C and
SIGTERM. A record never reported is counted missing (e.g. a concurrent test
restored `ratelimit` mid-run) and makes the exit status 1.

usage: kmsg-latency.py [--bin target/release/gpuwatch] [--count 2000]
         [--rate 500] [--burst 1] [--warmup 20] [--no-floor] [--json FILE] [--agent-arg ARG]...
  --burst B: write B records back to back, bursts spaced B/rate s apart.
"""
import argparse
import fcntl
import json
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PRINTK_DEVKMSG = "/proc/sys/kernel/printk_devkmsg"
# Shared with the test suite (gpuwatch_test_support::kmsg::LOCK_FILE).
KMSG_LOCK_FILE = "/tmp/gpuwatch-dev-kmsg.lock"
# The record's index follows the nonce in the process name (`name=` ends at the
# comma), so the bare reader finds both in the kernel's copy of the line.
TAG_PREFIX = "gpuwatch-bench-"
XID_LINE = ("<4>NVRM: Xid (PCI:{dom:04x}:{bus:02x}:00): 31, pid={pid}, "
            "name=" + TAG_PREFIX + "{nonce} {i}, "
            "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted "
            "@ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ\n")
PCI_RE = re.compile(rb'"pci_address":"([0-9a-f]{4}):([0-9a-f]{2}):00\.0"')
TS_RE = re.compile(rb'"monotonic_usec":"?([0-9]+)')


def stdout_reader_main(out_path):
    """Child process: timestamp every chunk of stdin (the agent's stdout) as it
    arrives; at EOF write `PCI_KEY T_NS RECORD_TS_USEC` per event line."""
    chunks = []
    read, now = os.read, time.monotonic_ns
    while True:
        data = read(0, 1 << 20)
        t = now()
        if not data:
            break
        chunks.append((t, data))
    pending = b""
    with open(out_path, "w") as out:
        for t, data in chunks:
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                m = PCI_RE.search(line)
                if m:
                    key = int(m.group(1), 16) << 8 | int(m.group(2), 16)
                    ts = TS_RE.search(line)
                    out.write(f"{key} {t} {ts.group(1).decode() if ts else -1}\n")


def kmsg_reader_main(out_path, nonce, count):
    """Child process, the kernel floor: a bare poll/read /dev/kmsg reader that
    timestamps the records of this run (`I T_NS` lines; a record of this run
    holds `TAG_PREFIX + nonce + " "` followed by its index) until it has seen
    `count` of them or 10 s pass without one."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    os.lseek(fd, 0, os.SEEK_END)
    p = select.poll()
    p.register(fd, select.POLLIN)
    tag = f"{TAG_PREFIX}{nonce} ".encode()
    got = []
    read, now = os.read, time.monotonic_ns
    os.write(1, b"ready\n")
    while len(got) < count:
        if not p.poll(10_000):
            break
        while True:
            try:
                rec = read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # ring overran us: keep reading
                continue
            t = now()
            at = rec.find(tag)
            if at >= 0:
                rest = rec[at + len(tag):]
                digits = len(rest) - len(rest.lstrip(b"0123456789"))
                got.append((int(rest[:digits]), t))
    with open(out_path, "w") as out:
        for i, t in got:
            out.write(f"{i} {t}\n")


def no_such_pid():
    """The first of the records' pids: above the kernel's pid_max, so no process
    holds any of them. The agent attributes each XID's pid from /proc at once;
    a pid of no process is the common case of a crashed job's XIDs (the process
    is gone), and costs the same on every machine. Pids 1..n instead hit
    whatever kernel threads and daemons this machine happens to run with low
    pids (the first bursts paid a full /proc read per record there)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read()) + 1
    except (OSError, ValueError):
        return (1 << 22) + 1


def percentile(sorted_vals, q):
    """Nearest-rank percentile of a sorted list."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, int(round(q * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def summary(vals):
    vals = sorted(vals)
    if not vals:
        return None
    return {
        "p50": round(percentile(vals, 0.50), 1), "p90": round(percentile(vals, 0.90), 1),
        "p99": round(percentile(vals, 0.99), 1), "p999": round(percentile(vals, 0.999), 1),
        "max": round(vals[-1], 1), "mean": round(sum(vals) / len(vals), 1),
        "over_1ms": sum(1 for v in vals if v > 1000.0),
    }


def write_records(lines, rate, burst):
    """Writes `lines` to /dev/kmsg on schedule; returns (write times in ns, seconds)."""
    written = [0] * len(lines)
    fd = os.open("/dev/kmsg", os.O_WRONLY | os.O_CLOEXEC)
    period_ns = int(burst * 1e9 / rate)
    now = time.monotonic_ns
    t_start = now() + 10_000_000
    try:
        for b, first in enumerate(range(0, len(lines), burst)):
            left = t_start + b * period_ns - now()
            if left > 0:
                time.sleep(left / 1e9)
            for i in range(first, min(first + burst, len(lines))):
                written[i] = now()
                os.write(fd, lines[i])
    finally:
        os.close(fd)
    return written, (now() - t_start) / 1e9


def scrape(port):
    """The latency histogram from /metrics: ({le: cumulative count}, sum, count)."""
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    buckets, total, count = {}, 0.0, 0
    for line in text.splitlines():
        if line.startswith("gpuwatch_pipeline_latency_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("gpuwatch_pipeline_latency_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("gpuwatch_pipeline_latency_seconds_count"):
            count = int(float(line.rsplit(" ", 1)[1]))
    return buckets, total, count


def histogram_delta(before, after):
    """Observations between two scrapes: ([(le, in bucket, cumulative)], sum, count)."""
    (b0, s0, c0), (b1, s1, c1) = before, after
    les = sorted(b1, key=lambda le: float("inf") if le == "+Inf" else float(le))
    out, prev = [], 0
    for le in les:
        cum = b1[le] - b0.get(le, 0)
        out.append((le, cum - prev, cum))
        prev = cum
    return out, s1 - s0, c1 - c0


def bucket_quantile(delta, count, q):
    """Upper bound of the bucket holding the q-quantile (what Prometheus can say)."""
    if count == 0:
        return None
    for le, _, cum in delta:
        if cum >= q * count:
            return le
    return "+Inf"


def wait_ready(port, agent, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise SystemExit(f"gpuwatch exited early with status {agent.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"gpuwatch did not become ready within {timeout:.0f} s")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_floor_reader(work, nonce, n):
    """The bare reader, started and positioned at the ring's end."""
    out = os.path.join(work, "floor.txt")
    reader = subprocess.Popen([sys.executable, __file__, "--kmsg-reader", out, nonce, str(n)],
                              stdout=subprocess.PIPE)
    if reader.stdout.readline() != b"ready\n":
        reader.kill()
        raise SystemExit("the bare kmsg reader did not start")
    return reader, out


def floor_times(out):
    seen = {}
    with open(out) as f:
        for line in f:
            i, t = line.split()
            seen.setdefault(int(i), int(t))
    return seen


def measure(args, work):
    """The agent and (unless --no-floor) the bare reader read the SAME records
    side by side: both sleep in poll() on /dev/kmsg and the kernel wakes both
    from the same deferred wake-up, so per record `agent - bare` is the agent's
    own cost, free of where the write fell relative to the kernel's tick."""
    port = free_port()
    events = os.path.join(work, "events.txt")
    log = open(os.path.join(work, "agent.err"), "wb")
    agent = subprocess.Popen(
        [args.bin, "run", "--sink", "stdout", "--accept-user-facility", "--no-nvml",
         "--prometheus", "--api-listen", f"127.0.0.1:{port}",
         "--state-dir", os.path.join(work, "state"), "--node-name", "bench",
         "--log-format", "json", *args.agent_arg],
        stdout=subprocess.PIPE, stderr=log)
    reader = subprocess.Popen([sys.executable, __file__, "--stdout-reader", events],
                              stdin=agent.stdout)
    agent.stdout.close()
    n = args.count + args.warmup
    nonce = f"{random.getrandbits(48):012x}"
    floor = None
    try:
        wait_ready(port, agent)
        time.sleep(0.5)  # let the start-up read of the ring settle
        if not args.no_floor:
            floor = start_floor_reader(work, nonce, n)
        before = scrape(port)
        base = random.randrange(0x1000 << 8, (0xf000 << 8) - n)
        pids = no_such_pid()
        lines = [XID_LINE.format(dom=(base + i) >> 8, bus=(base + i) & 0xff, i=i, pid=pids + i,
                                 nonce=nonce).encode()
                 for i in range(n)]
        written, elapsed = write_records(lines, args.rate, args.burst)
        time.sleep(args.settle)
        after = scrape(port)
        if floor:
            floor[0].wait(timeout=30)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        reader.wait(timeout=30)
        log.close()
        if floor and floor[0].poll() is None:
            floor[0].kill()
            floor[0].wait()
    seen = {}
    with open(events) as f:
        for line in f:
            key, t, ts = line.split()
            seen.setdefault(int(key), (int(t), int(ts)))
    bare = floor_times(floor[1]) if floor else {}
    lat, logged, ring, bare_lat, extra = [], [], [], [], []
    for i in range(args.warmup, n):
        b = bare.get(i)
        if b is not None:
            bare_lat.append((b - written[i]) / 1000.0)
        got = seen.get(base + i)
        if got is None:
            continue
        t, ts = got
        lat.append((t - written[i]) / 1000.0)
        if b is not None:
            extra.append((t - b) / 1000.0)
        if ts >= 0:
            logged.append(ts - written[i] / 1000.0)
            ring.append(t / 1000.0 - ts)
    # The kernel stamps records with local_clock, which differs from
    # CLOCK_MONOTONIC by a near-constant offset (hundreds of us in VMs). write ->
    # in ring takes a few us at best, so the smallest (ts - write) estimates it.
    offset = min(logged) if logged else 0.0
    split = bool(logged) and abs(offset) < 1_000_000.0
    delta, hsum, hcount = histogram_delta(before, after)
    result = {
        "write_seconds": round(elapsed, 3),
        "matched": len(lat),
        "missing": args.count - len(lat),
        "write_to_event_us": summary(lat),
        "kernel_clock_offset_us": round(offset, 1) if split else None,
        "write_to_ring_us": summary(v - offset for v in logged) if split else None,
        "ring_to_event_us": summary(v + offset for v in ring) if split else None,
        "agent_histogram": {
            "count": hcount,
            "mean_us": round(hsum / hcount * 1e6, 1) if hcount else None,
            "p50_le_s": bucket_quantile(delta, hcount, 0.50),
            "p99_le_s": bucket_quantile(delta, hcount, 0.99),
            "buckets": {le: c for le, c, _ in delta if c},
        },
    }
    if floor:
        result["floor"] = {"matched": len(bare_lat), "missing": args.count - len(bare_lat),
                           "write_to_read_us": summary(bare_lat)}
        result["agent_minus_bare_us"] = summary(extra)
        if os.environ.get("KMSG_LATENCY_DUMP"):
            with open(os.environ["KMSG_LATENCY_DUMP"], "w") as f:
                for i in range(args.warmup, n):
                    b, got = bare.get(i), seen.get(base + i)
                    f.write(f"{i} {written[i]} {b} {got[0] if got else None}\n")
    return result


def fmt(s):
    return (f"p50 {s['p50']:.0f} us, p90 {s['p90']:.0f} us, p99 {s['p99']:.0f} us, "
            f"p99.9 {s['p999']:.0f} us, max {s['max']:.0f} us ({s['over_1ms']} over 1 ms)")


def report(r):
    mode = "steady" if r["burst"] == 1 else f"bursts of {r['burst']}"
    print(f"   {r['records']} records at {r['rate_per_sec']:g}/s ({mode}); "
          f"{r['warmup']} warm-up records not counted; kernel CONFIG_HZ "
          f"{r['kernel_hz'] or 'unknown'}; {r['cpus']} CPUs, load average "
          f"{r['loadavg_before']} -> {r['loadavg_after']} (other work on the machine shows up "
          "in the tails)")
    a = r["agent"]
    f = a.get("floor")
    if f:
        if f["write_to_read_us"]:
            print(f"   kernel floor, bare poll()+read() reader: {fmt(f['write_to_read_us'])}"
                  + (f"; missing {f['missing']}" if f["missing"] else ""))
        else:
            print("   kernel floor: no record reached the bare reader")
    if a["write_to_event_us"]:
        print(f"   AGENT kmsg write -> FaultEvent on stdout: {fmt(a['write_to_event_us'])}; "
              f"matched {a['matched']}, missing {a['missing']}")
    if a["ring_to_event_us"]:
        w, g = a["write_to_ring_us"], a["ring_to_event_us"]
        print(f"     split by the record's kernel timestamp (offset {a['kernel_clock_offset_us']} us "
              f"calibrated out): write -> in ring p99 {w['p99']:.0f} us; in ring -> event "
              f"p50 {g['p50']:.0f} us, p99 {g['p99']:.0f} us")
    h = a["agent_histogram"]
    if h["count"]:
        print(f"     agent's own read -> emitted histogram: {h['count']} obs, mean {h['mean_us']} us, "
              f"p50 <= {h['p50_le_s']} s, p99 <= {h['p99_le_s']} s; per bucket {h['buckets']}")
    d = a.get("agent_minus_bare_us")
    if d:
        print(f"   AGENT - BARE READER, same record (the agent's own cost): p50 {d['p50']:.0f} us, "
              f"p90 {d['p90']:.0f} us, p99 {d['p99']:.0f} us, max {d['max']:.0f} us")


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def kernel_hz():
    """CONFIG_HZ from /proc/config.gz or /boot/config-$(uname -r), if readable."""
    import gzip
    for path, opener in (("/proc/config.gz", gzip.open),
                         (f"/boot/config-{os.uname().release}", open)):
        try:
            with opener(path, "rt") as f:
                for line in f:
                    if line.startswith("CONFIG_HZ="):
                        return int(line.split("=", 1)[1])
        except OSError:
            continue
    return None


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--stdout-reader":
        stdout_reader_main(sys.argv[2])
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--kmsg-reader":
        kmsg_reader_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default="target/release/gpuwatch")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--rate", type=float, default=500.0)
    p.add_argument("--burst", type=int, default=1)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--settle", type=float, default=1.0, help="seconds to wait after the last write")
    p.add_argument("--no-floor", action="store_true", help="skip the bare-reader measurement")
    p.add_argument("--json", help="also write the result as JSON to this file")
    p.add_argument("--agent-arg", action="append", default=[],
                   help="one more argument for `gpuwatch run` (repeatable)")
    args = p.parse_args()
    if args.count < 1 or args.rate <= 0 or args.warmup < 0 or args.burst < 1:
        p.error("--count, --rate and --burst must be positive, --warmup not negative")
    if os.geteuid() != 0:
        raise SystemExit("kmsg-latency.py needs root (writes /dev/kmsg, sets printk_devkmsg)")
    if not os.access(args.bin, os.X_OK):
        raise SystemExit(f"{args.bin} is not an executable; build it first")
    lock = os.open(KMSG_LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the process ends
    with open(PRINTK_DEVKMSG) as f:
        old = f.read().strip()

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    r = {"records": args.count, "warmup": args.warmup, "rate_per_sec": args.rate,
         "burst": args.burst, "kernel_hz": kernel_hz(), "cpus": os.cpu_count(),
         "loadavg_before": loadavg()}
    try:
        with open(PRINTK_DEVKMSG, "w") as f:
            f.write("on\n")
        with tempfile.TemporaryDirectory(prefix="gpuwatch-kmsglat.") as work:
            r["agent"] = measure(args, work)
    finally:
        with open(PRINTK_DEVKMSG, "w") as f:
            f.write(old + "\n")
    r["loadavg_after"] = loadavg()
    report(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    missing = r["agent"]["missing"] + r["agent"].get("floor", {}).get("missing", 0)
    if missing:
        print(f"   WARNING: {missing} records were never seen (printk_devkmsg changed under "
              "the run, or the agent lost them; see its log).", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
