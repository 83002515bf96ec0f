"""The cairnq Python worker draining a backlog of no-op tasks: the reference
row of `cargo xtask bench drain`.

    CAIRNQ_DSN=postgres://... python bench_drain.py --queue bench --total 20000 --concurrency 64

Starts one worker on the queue, waits until `--total` tasks of it have
succeeded, and prints one JSON line: tasks_per_s, the worker's CPU in cores
(this process), and the settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from cairnq import CairnQ, Worker


async def drain(args: argparse.Namespace) -> dict:
    dsn = os.environ.get("CAIRNQ_DSN") or sys.exit("bench_drain.py: CAIRNQ_DSN is not set")
    client = CairnQ.postgres(dsn, max_size=1)
    await client.connect()
    worker = Worker.postgres(
        dsn,
        queues=[args.queue],
        concurrency=args.concurrency,
        poll_interval_ms=100,
        max_size=args.pool,
    )

    @worker.task("bench.noop")
    async def noop(ctx, payload):  # noqa: ARG001 - a no-op, like the Rust side's
        return None

    started, cpu0 = time.perf_counter(), time.process_time()
    runner = asyncio.create_task(worker.run())
    try:
        while True:
            if runner.done():
                runner.result()
                sys.exit("bench_drain.py: the worker stopped by itself")
            counts = (await client.stats(args.queue))[args.queue]
            if counts["succeeded"] >= args.total:
                break
            if time.perf_counter() - started > args.timeout_s:
                sys.exit(f"bench_drain.py: {counts} after {args.timeout_s}s")
            await asyncio.sleep(0.02)
        took = time.perf_counter() - started
        cpu = (time.process_time() - cpu0) / took
    finally:
        worker.stop()
        await runner
        await worker.close()
        await client.close()
    return {
        "tasks_per_s": args.total / took,
        "cpu_cores": cpu,
        "concurrency": args.concurrency,
        "pool": args.pool,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench_drain.py")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--total", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    args = parser.parse_args()
    sys.stdout.write(json.dumps(asyncio.run(drain(args))) + "\n")


if __name__ == "__main__":
    main()
