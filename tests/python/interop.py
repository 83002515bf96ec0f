"""The Python side of waymark's interop tests (tests/tests/interop.rs).

Drives the real cairnq SDK against the database the Rust test prepared and
prints one JSON document on stdout for the Rust side to assert on. Anything
unexpected exits non-zero with the reason on stderr, which fails the test.

    interop.py submit SPECS_JSON [--ids-only]
                                          submit tasks, print them
    interop.py submit-traced NAME QUEUE   submit one task inside an OpenTelemetry
                                          span, its W3C context in the metadata;
                                          print the task's id and the span's ids
    interop.py wait ID... [--timeout-ms]  wait for each task, print the final rows
    interop.py read [--id ID]... [--key KEY]...
                                          print tasks by id and by key, and stats
    interop.py work --until ID... [--timeout-s] [--lease-ms]
                                          run a worker until those tasks finish
    interop.py sweep --older-than-ms MS --limit N --for-s S
                                          run cairnq's retention sweeper for S
                                          seconds, print the errors it reported

The DSN comes from $CAIRNQ_DSN.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from typing import Any

import cairnq
from cairnq import CairnQ, CairnQError, TaskError, Worker


def dsn() -> str:
    value = os.environ.get("CAIRNQ_DSN")
    if not value:
        sys.exit("interop.py: CAIRNQ_DSN is not set")
    return value


def task_json(task: Any) -> Any:
    return None if task is None else dataclasses.asdict(task)


def emit(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, sort_keys=True))
    sys.stdout.write("\n")


async def connected() -> CairnQ:
    client = CairnQ.postgres(dsn(), max_size=4)
    # Runs cairnq's schema guard, its migration ledger and the protocol check.
    await client.connect()
    return client


# ----------------------------------------------------------------- client side

SUBMIT_OPTIONS = ("key", "conflict", "queue", "max_attempts", "priority", "metadata", "delay_ms")


async def cmd_submit(args: argparse.Namespace) -> None:
    specs = json.loads(args.specs)
    client = await connected()
    try:
        out = []
        for spec in specs:
            options = {k: spec[k] for k in SUBMIT_OPTIONS if k in spec}
            try:
                task = await client.submit(spec["name"], spec.get("payload"), **options)
            except CairnQError as exc:
                out.append({"error": type(exc).__name__, "message": str(exc)})
            else:
                # --ids-only: a payload may hold numbers the reader of this
                # output cannot parse (that is what such a test is about).
                out.append({"task": {"id": task.id} if args.ids_only else task_json(task)})
        emit(
            {
                "sdk_version": cairnq.__version__,
                "protocol_version": await client.store.protocol_version(),
                "submitted": out,
            }
        )
    finally:
        await client.close()


async def cmd_submit_traced(args: argparse.Namespace) -> None:
    # OpenTelemetry's own SDK and W3C propagator, as a traced Python app
    # would use them: the context goes into the task's metadata.
    from opentelemetry import propagate
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("waymark-interop")
    client = await connected()
    try:
        with tracer.start_as_current_span("python submit") as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            task = await client.submit(args.name, {"from": "python"}, queue=args.queue, metadata=carrier)
        cx = span.get_span_context()
        emit(
            {
                "id": task.id,
                "metadata": carrier,
                "trace_id": format(cx.trace_id, "032x"),
                "span_id": format(cx.span_id, "016x"),
            }
        )
    finally:
        await client.close()


async def cmd_wait(args: argparse.Namespace) -> None:
    client = await connected()
    try:
        finals = await asyncio.gather(
            *(client.wait(task_id, timeout_ms=args.timeout_ms) for task_id in args.ids)
        )
        emit({"tasks": {t.id: task_json(t) for t in finals}})
    finally:
        await client.close()


async def cmd_read(args: argparse.Namespace) -> None:
    client = await connected()
    try:
        emit(
            {
                "by_id": {i: task_json(await client.get(i)) for i in args.id},
                "by_key": {k: task_json(await client.get_by_key(k)) for k in args.key},
                "stats": await client.stats(),
            }
        )
    finally:
        await client.close()


# ----------------------------------------------------------------- worker side


def register_handlers(worker: Worker, runs: list[dict[str, Any]], cancels: list[str]) -> None:
    def ran(ctx: Any, payload: Any) -> None:
        runs.append(
            {"id": ctx.task_id, "name": ctx.name, "attempt": ctx.attempt, "payload": payload}
        )

    @worker.task("py.ok")
    async def ok(ctx, payload):
        ran(ctx, payload)
        return {"echo": payload, "sum": payload["x"] + 1, "by": "python"}

    @worker.task("py.echo")
    async def echo(ctx, payload):
        # Any JSON value in, the same value out as the result; what the
        # handler saw of its metadata goes in the report.
        ran(ctx, payload)
        runs[-1]["metadata"] = ctx.metadata
        return payload

    @worker.task("py.boom")
    async def boom(ctx, payload):
        ran(ctx, payload)
        # A TaskError is permanent unless it says otherwise.
        raise TaskError(
            payload["reason"], code="account_missing", details={"account": payload["account"]}
        )

    @worker.task("py.crash")
    async def crash(ctx, payload):
        ran(ctx, payload)
        # Any other exception is a retryable handler_error.
        raise ValueError(payload["message"])

    @worker.task("mixed.job")
    async def mixed(ctx, payload):
        # Shared with a waymark worker on the same queue (the mixed fleet):
        # 200 ms each, so that alone this worker would take over a second
        # and the waymark one, started after its first claim, joins in.
        ran(ctx, payload)
        await asyncio.sleep(0.2)
        return {"by": "python", "n": payload["n"]}

    @worker.task("py.slow")
    async def slow(ctx, payload):
        ran(ctx, payload)
        await ctx.progress(0.5, "halfway")
        loop = asyncio.get_running_loop()
        give_up = loop.time() + payload.get("give_up_s", 60)
        while not await ctx.canceled():
            if loop.time() > give_up:
                raise RuntimeError("py.slow was never asked to stop")
            await asyncio.sleep(0.05)
        cancels.append(ctx.task_id)
        return {"stopped": "early"}


async def cmd_work(args: argparse.Namespace) -> None:
    runs: list[dict[str, Any]] = []
    cancels: list[str] = []
    errors: list[str] = []
    worker = Worker.postgres(
        dsn(),
        concurrency=8,
        lease_ms=args.lease_ms,
        poll_interval_ms=100,
        max_size=4,
        on_error=lambda exc, info: errors.append(f"{type(exc).__name__}: {exc} {info}"),
    )
    register_handlers(worker, runs, cancels)
    client = await connected()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout_s
    runner = asyncio.create_task(worker.run())
    try:
        while True:
            if runner.done():
                runner.result()  # raises what stopped it
                sys.exit("interop.py work: the worker stopped by itself")
            refs = [await client.get_status(i) for i in args.until]
            if all(r is not None and r.is_terminal for r in refs):
                break
            if loop.time() > deadline:
                states = {i: (r.status if r else None) for i, r in zip(args.until, refs)}
                sys.exit(f"interop.py work: tasks not finished after {args.timeout_s}s: {states}")
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await runner
        await worker.close()
        await client.close()
    emit({"worker_id": worker.worker_id, "runs": runs, "observed_cancel": cancels, "errors": errors})


# -------------------------------------------------------------- retention side

async def cmd_sweep(args: argparse.Namespace) -> None:
    errors: list[str] = []
    retention = cairnq.Retention(
        older_than_ms=args.older_than_ms,
        interval_ms=20,
        limit=args.limit,
        on_error=lambda exc: errors.append(f"{type(exc).__name__}: {exc}"),
    )
    # The SDK's own scheduled sweeper: it starts when the client connects
    # and stops (waiting out a sweep in flight) when it closes.
    client = CairnQ.postgres(dsn(), max_size=4, retention=retention)
    await client.connect()
    try:
        await asyncio.sleep(args.for_s)
    finally:
        await client.close()
    emit({"errors": errors})


def main() -> None:
    parser = argparse.ArgumentParser(prog="interop.py")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("submit")
    p.add_argument("specs", help="JSON list of {name, payload, key?, conflict?, ...}")
    p.add_argument("--ids-only", action="store_true", help="print each task's id only")
    p.set_defaults(run=cmd_submit)

    p = sub.add_parser("submit-traced")
    p.add_argument("name")
    p.add_argument("queue")
    p.set_defaults(run=cmd_submit_traced)

    p = sub.add_parser("wait")
    p.add_argument("ids", nargs="+")
    p.add_argument("--timeout-ms", type=int, default=30_000)
    p.set_defaults(run=cmd_wait)

    p = sub.add_parser("read")
    p.add_argument("--id", action="append", default=[])
    p.add_argument("--key", action="append", default=[])
    p.set_defaults(run=cmd_read)

    p = sub.add_parser("work")
    p.add_argument("--until", nargs="+", required=True)
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--lease-ms", type=int, default=3_000)
    p.set_defaults(run=cmd_work)

    p = sub.add_parser("sweep")
    p.add_argument("--older-than-ms", type=int, required=True)
    p.add_argument("--limit", type=int, default=1_000)
    p.add_argument("--for-s", type=float, default=3.0)
    p.set_defaults(run=cmd_sweep)

    args = parser.parse_args()
    asyncio.run(args.run(args))


if __name__ == "__main__":
    main()
