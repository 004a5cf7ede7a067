"""`gpuflex`: run the server (serve, worker, manage) or use it (submit, jobs, download).

The buyer commands use only the SDK (marketplace.client, httpx); Django is imported only by
the server commands, inside their functions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from marketplace.client import (
    EXPORT_WAIT_S,
    Client,
    GPUFlexError,
    missing_spec_files,
    server_url,
)

SETTINGS = "marketplace.server.settings.base"


def build_client(args: argparse.Namespace) -> Client:
    return Client(args.server, args.key)


class CliError(Exception):
    """A mistake in the command line or the files it names: one line on stderr, exit 2."""


def _job_id(client: Client, ref: str) -> str:
    """The full id of the job `ref` names: its id, or a unique start of it (the web's 8)."""
    return client.resolve_job(ref)


def _need_file(path: str | None, what: str) -> None:
    if path is not None and not os.path.isfile(path):
        problem = "is a folder, not a file" if os.path.isdir(path) else "does not exist"
        raise CliError(f"{what} {path} {problem}")


# -- server commands ---------------------------------------------------------------------


def _server_env() -> dict[str, str]:
    return os.environ | {
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", SETTINGS)
    }


def _tool(name: str) -> str:
    """A console script from this interpreter's environment (the venv), else from PATH."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else (shutil.which(name) or name)


def metrics_env(env: dict[str, str], name: str, role: str = "web") -> dict[str, str]:
    """The server process's environment with its own, freshly emptied, metrics folder
    (prometheus_client's multiprocess mode: marketplace/observability/multiproc.py)."""
    from marketplace.observability.multiproc import prepare

    return prepare(env, name) | {"GPUFLEX_PROCESS_ROLE": role}


def _exec(cmd: list[str], env: dict[str, str]) -> int:
    """Become the server process, so that signals from a supervisor reach it directly."""
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


# the management commands that run without a database: everything else reads one
NEEDS_NO_DATABASE = frozenset(
    {"migrate", "makemigrations", "check", "help", "version", "collectstatic", "diffsettings",
     "--help", "-h", "--version"}
)  # fmt: skip


def missing_database(command: str | None, env: dict[str, str]) -> str | None:
    """Why `gpuflex manage COMMAND` cannot run here, or None: with the default settings and
    no DATABASE_URL the database is the data folder's SQLite file, and a command that reads
    it must find it (run elsewhere it would create an empty `.gpuflex/` and fail on its
    missing tables)."""
    if command in NEEDS_NO_DATABASE or command is None:
        return None
    if env.get("DATABASE_URL") or env.get("DJANGO_SETTINGS_MODULE", SETTINGS) != SETTINGS:
        return None
    data = Path(env.get("GPUFLEX_DATA_DIR") or Path.cwd() / ".gpuflex").resolve()
    if (data / "gpuflex.sqlite3").is_file():
        return None
    return (
        f"no marketplace database in {data} (the data folder: GPUFLEX_DATA_DIR, by default "
        "./.gpuflex). Run it from the folder the server ran in, set GPUFLEX_DATA_DIR to "
        "that server's data folder (the demo's: GPUFLEX_DATA_DIR=.gpuflex-demo/server), or "
        "set DATABASE_URL; `gpuflex manage migrate` creates a new one"
    )


def cmd_manage(args: argparse.Namespace) -> int:
    words = [a for a in args.rest if not a.startswith("-")] or args.rest
    command = words[0] if words else None
    if (problem := missing_database(command, dict(os.environ))) is not None:
        print(f"gpuflex manage {command}: {problem}", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    from marketplace.manage import main as manage

    manage(["gpuflex manage", *args.rest])
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from marketplace.server import http_server
    from marketplace.server.bind import PROXIES_ENV, BindError, bind_problem
    from marketplace.server.secret_key import serve_problem

    env = _server_env()
    if args.dev:
        env["GPUFLEX_DEV"] = "1"
    if args.behind_proxy and not env.get(PROXIES_ENV, "").strip():
        env[PROXIES_ENV] = "1"  # one nginx in front: its forwarded headers are believed
    # a public or missing key lets anyone forge sessions, and the server reachable without a
    # proxy lets slow clients hold every thread: both refused before anything starts
    for problem in (serve_problem(env), bind_problem(args.bind, env)):
        if problem is not None:
            print(f"gpuflex serve: {problem}", file=sys.stderr)
            return 2
    try:  # before migrating: a name that does not resolve is the command line's mistake
        cmd = http_server.command(
            _tool("granian"), args.bind, args.workers, args.threads, access_log=args.access_log
        )
    except BindError as exc:
        print(f"gpuflex serve: {exc}", file=sys.stderr)
        return 2
    if not args.no_migrate:
        migrate = [sys.executable, "-m", "marketplace.manage", "migrate", "--noinput", "-v", "0"]
        subprocess.run(migrate, env=env, check=True)
    return _exec(cmd, metrics_env(env, f"web-{args.bind}"))


# the commands that start a server process: their environment is checked before anything
# starts, so a bad value is one message naming it, not a traceback from the web server or Celery
SERVER_COMMANDS = frozenset({"serve", "worker", "beat", "manage"})


def check_server_settings() -> None:
    """CliError listing every bad server setting in the environment (settings/environment.py),
    each as `NAME: got 'VALUE', wants ...`."""
    from marketplace.server.settings.environment import SettingsError, check

    try:
        check(_server_env())
    except SettingsError as exc:
        raise CliError(
            "refusing to start, the environment has bad settings (docs/settings.md):\n  "
            + "\n  ".join(exc.problems)
        ) from None


def cmd_settings(args: argparse.Namespace) -> int:
    """The server's settings: their documentation, or this environment's values."""
    from marketplace.server.settings import environment

    if args.write:
        path = Path(args.write)
        path.write_text(environment.with_table(path.read_text(encoding="utf-8")), "utf-8")
        return 0
    if args.markdown:
        print(environment.markdown(), end="")
        return 0
    check_server_settings()
    values = environment.read(_server_env())
    for setting in environment.TABLE:
        value = values[setting.env]
        if setting.secret and value:
            value = "(set, hidden)"
        elif isinstance(value, bool):
            value = int(value)
        elif value is None:
            value = f"  # unset: {setting.default_text()}"
        print(f"{setting.env}={value}")
    return 0


def cmd_nginx_config(args: argparse.Namespace) -> int:
    from marketplace.server.proxy import ProxySettings, nginx_server_block

    upstream = ",".join(args.upstream or ["127.0.0.1:8000"])
    settings = ProxySettings(listen=args.listen, upstream=upstream, server_name=args.server_name)
    print(nginx_server_block(settings), end="")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from marketplace.server.routing import worker_queues

    cmd = [
        _tool("celery"), "-A", "marketplace.server.celery", "worker",
        "--concurrency", str(args.concurrency), "--pool", args.pool,
        "--loglevel", args.loglevel, "-Q", ",".join(worker_queues(args.queues)),
    ]  # fmt: skip
    if not args.no_beat:
        cmd.append("--beat-thread")  # the tick's clock in this process (server/celery.py)
    env = metrics_env(_server_env(), f"worker-{args.queues}", role="worker")
    if args.metrics_port is not None:
        env["GPUFLEX_METRICS_PORT"] = str(args.metrics_port)
    return _exec(cmd, env)


def cmd_beat(args: argparse.Namespace) -> int:
    """The periodic tick's clock alone: one per deployment, beside workers run --no-beat."""
    cmd = [_tool("celery"), "-A", "marketplace.server.celery", "beat", "--loglevel", args.loglevel]
    return _exec(cmd, metrics_env(_server_env(), "beat", role="worker"))


# -- buyer commands ----------------------------------------------------------------------


def _progress(client: Client, job: dict[str, Any], interval: float) -> dict[str, Any]:
    from tqdm import tqdm

    from marketplace.demo.progress import say_node_states

    bar = tqdm(total=job["max_rounds"], desc=job["name"], unit="round")
    state = job
    said = None
    try:
        for state in client.follow(job["id"], interval):
            said = say_node_states(state, said, tqdm.write)
            bar.update(state["rounds_done"] - bar.n)
            metrics = state.get("last_metrics") or {}
            if "accuracy" in metrics:
                bar.set_postfix(accuracy=f"{metrics['accuracy']:.3f}", status=state["status"])
    finally:
        bar.close()
    return state


class UploadBar:
    """A byte progress bar for a chunked upload, opened at its first report (a dataset sent
    inline reports nothing and shows none)."""

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, initial=done, desc=self.desc, unit="B",
                            unit_scale=True, unit_divisor=1024)  # fmt: skip
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _check_submit_files(args: argparse.Namespace) -> None:
    """Every file the command will read exists, before anything is sent: the spec, the
    files given as options, and those the spec names beside it (paths relative to it)."""
    _need_file(args.spec, "the spec file")
    _need_file(args.dataset, "the --dataset file")
    _need_file(args.checkpoint, "the --checkpoint file")
    _need_file(args.model_config, "the --model-config file")
    given = {"dataset.path": args.dataset, "model.checkpoint": args.checkpoint,
             "model.config": args.model_config}  # fmt: skip
    missing = missing_spec_files(Path(args.spec), federated=bool(args.federated))
    for field, path in missing.items():
        if given.get(field) is None:
            option = {"dataset.path": " or pass --dataset FILE",
                      "model.checkpoint": " or pass --checkpoint FILE",
                      "model.config": " or pass --model-config FILE"}.get(field, "")  # fmt: skip
            raise CliError(
                f"the spec's {field} names {path.name!r}, which is not at {path} (paths in a "
                f"spec are relative to the spec file): put it there{option}"
            )


def cmd_submit(args: argparse.Namespace) -> int:
    _check_submit_files(args)
    bar = UploadBar(f"uploading {os.path.basename(args.dataset or '')}")
    with build_client(args) as client:
        try:
            job = client.submit(
                args.spec,
                dataset=args.dataset,
                tier=args.tier,
                budget=args.budget,
                max_price_per_gpu_hour=args.max_price,
                federated=args.federated or "",
                checkpoint=args.checkpoint,
                model_config=args.model_config,
                progress=bar,
            )
        finally:
            bar.close()
        print(f"submitted {job['id']} ({job['name']}, {job.get('kind', 'train')})")
        if args.max_price is None and job.get("max_price_per_gpu_hour") is not None:
            print(
                f"max price {job['max_price_per_gpu_hour']} per GPU-hour: the market's "
                "median asking price of the nodes that fit (--max-price sets another)"
            )
        if args.follow:
            job = _progress(client, job, args.interval)
            print(f"{job['id']}: {job['status']} after {job['rounds_done']} round(s)")
            if job.get("result"):
                print(f"result: {json.dumps(job['result'])}")
            return 0 if job["status"] == "completed" else 1
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    _need_file(args.file, "the file")
    bar = UploadBar(f"uploading {os.path.basename(args.file)}")
    with build_client(args) as client:
        try:
            upload = client.upload(args.file, progress=bar)
        finally:
            bar.close()
    print(f"uploaded {upload['id']} ({upload['size']} bytes, sha256 {upload['sha256']})")
    return 0


def cmd_examples_write(args: argparse.Namespace) -> int:
    from trainer.example_files import write_examples

    for path in write_examples(Path(args.folder), int(args.corpus_bytes)):
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from marketplace.demo.run import main as demo

    return demo(args)


def cmd_jobs(args: argparse.Namespace) -> int:
    with build_client(args) as client:
        rows = client.jobs()
    print(
        f"{'id':36}  {'kind':9} {'status':10} {'rounds':>7}  {'accuracy':>8}  {'ε spent':>11}  name"
    )
    for job in rows:
        acc = (job.get("last_metrics") or {}).get("accuracy")
        shown = f"{acc:.3f}" if acc is not None else "-"
        rounds = f"{job['rounds_done']}/{job['max_rounds']}"
        kind = job.get("kind", "train")
        eps = _epsilon(job.get("privacy"))
        print(f"{job['id']:36}  {kind:9} {job['status']:10} {rounds:>7}  {shown:>8}  {eps:>11}  "
              f"{job['name']}")  # fmt: skip
        for line in trial_lines(job):
            print(line)
    return 0


def trial_lines(job: dict[str, Any]) -> list[str]:
    """A sweep's trials under its row: number, state, rounds, value, cost and parameters,
    the best one starred."""
    best = job.get("best_trial")
    lines = []
    for t in job.get("trials") or []:
        mark = "*" if t["number"] == best else " "
        value = f"{t['value']:g}" if t.get("value") is not None else "-"
        params = " ".join(f"{k}={_short(v)}" for k, v in t["params"].items())
        lines.append(f"  {mark}trial {t['number']:<3} {t['state']:9} rounds {t['rounds']:<4} "
                     f"value {value:<8} cost {t['cost']:<9} {params}")  # fmt: skip
    return lines


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def cmd_jobs_action(args: argparse.Namespace) -> int:
    """`gpuflex jobs cancel|pause|resume JOB`."""
    with build_client(args) as client:
        job_id = _job_id(client, args.job)
        job = getattr(client, args.jobs_command)(job_id)
    print(f"{job['id']}: {job['status']} after {job['rounds_done']} round(s)")
    return 0


def cmd_predictions(args: argparse.Namespace) -> int:
    with build_client(args) as client:
        path = client.predictions(_job_id(client, args.job), args.output)
    print(f"predictions: {path}")
    return 0


def _epsilon(privacy: dict[str, Any] | None) -> str:
    """ε spent of the target ("1.2/8"), or "-" for a job without differential privacy."""
    if not privacy:
        return "-"
    spent = privacy.get("epsilon_spent")
    shown = f"{spent:.2g}" if spent is not None else "0"
    target = privacy.get("epsilon")
    return f"{shown}/{target:g}" if target is not None else shown


def cmd_export_model(args: argparse.Namespace) -> int:
    from marketplace.export_model import ExportModelError, export_model_command

    try:
        path = export_model_command(
            args.target, args.example, args.loss, Path(args.output), not args.loss_only
        )
    except ExportModelError as exc:
        print(f"gpuflex export-model: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _seconds(text: str) -> float:
    """A non-negative number of seconds (argparse's type for --wait)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more seconds")
    return value


def cmd_download(args: argparse.Namespace) -> int:
    with build_client(args) as client:
        job = _job_id(client, args.job)
        model, record = client.download(job, args.output, args.format, wait=args.wait)
    print(f"model: {model}\nprovenance: {record}")
    return 0


def _chain_url(args: argparse.Namespace) -> str:
    url = args.chain_url or os.environ.get("GPUFLEX_CHAIN_URL", "")
    if not url.startswith(("http://", "https://")):
        raise SystemExit("gpuflex: give a JSON-RPC URL to check against (--chain-url)")
    return url


def cmd_verify(args: argparse.Namespace) -> int:
    from marketplace.verify import dumps, format_verification

    with build_client(args) as client:
        result = client.verify(_job_id(client, args.job), _chain_url(args), args.output)
    print(dumps(result) if args.json else format_verification(result))
    return 0 if result.ok else 1


def cmd_withdraw(args: argparse.Namespace) -> int:
    with build_client(args) as client:
        if args.amount is None:
            print(json.dumps(client.withdrawals(), indent=1))
            return 0
        payout = client.withdraw(args.amount, args.key or f"cli-{uuid.uuid4()}")
    print(json.dumps(payout, indent=1))
    return 0


def cmd_withdraw_fees(args: argparse.Namespace) -> int:
    with build_client(args) as client:
        payout = client.withdraw_fees(args.amount, args.to, args.key or f"cli-{uuid.uuid4()}")
    print(json.dumps(payout, indent=1))
    return 0


def cmd_proof(args: argparse.Namespace) -> int:
    with build_client(args) as client:
        print(json.dumps(client.payout_proof(args.payout), indent=1))
    return 0


def cmd_contributions(args: argparse.Namespace) -> int:
    from marketplace.verify import check_contribution

    with build_client(args) as client:
        found = client.contributions(args.node, args.batch)
    ok = True
    for proof in found["batches"]:
        if args.check:
            proof["check"] = check_contribution(proof, args.chain_url or None)
            ok = ok and proof["check"]["ok"]
    print(json.dumps(found, indent=1))
    return 0 if ok else 1


def cmd_jobs_export(args: argparse.Namespace) -> int:
    with build_client(args) as client:
        job_id = _job_id(client, args.job)
        where = client.export(job_id, args.to, args.target)
    print(f"{job_id} logged to {args.to}: {where}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuflex", description=__doc__.splitlines()[0])
    p.add_argument("--server", default=None, help="marketplace URL (env GPUFLEX_SERVER)")
    p.add_argument("--key", default=None, help="API key (env GPUFLEX_API_KEY)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the API server (granian)")
    s.add_argument(
        "--bind",
        default="127.0.0.1:8000",
        help="a loopback address, or any with --behind-proxy (default 127.0.0.1:8000)",
    )
    s.add_argument(
        "--behind-proxy",
        action="store_true",
        help="nginx (`gpuflex nginx-config`) is in front: allows a non-loopback --bind and "
        "sets GPUFLEX_TRUSTED_PROXIES=1 unless it is set",
    )
    s.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 1))
    s.add_argument("--threads", type=int, default=16)
    s.add_argument("--no-migrate", action="store_true")
    s.add_argument("--access-log", action="store_true")
    s.add_argument(
        "--dev",
        action="store_true",
        help="local development (GPUFLEX_DEV=1): without SECRET_KEY, use the data dir's own key",
    )
    s.set_defaults(func=cmd_serve)

    w = sub.add_parser("worker", help="run a Celery worker with the periodic tick (beat)")
    w.add_argument("--concurrency", type=int, default=1)
    w.add_argument(
        "--pool",
        choices=("prefork", "solo", "threads"),
        default="prefork",
        help="solo: tasks run in the worker process itself (the least memory)",
    )
    w.add_argument("--loglevel", default="INFO")
    w.add_argument(
        "--no-beat",
        action="store_true",
        help="no tick clock in this worker: run exactly one `gpuflex beat` (or one worker "
        "without --no-beat) per deployment",
    )
    w.add_argument(
        "--queues",
        choices=("all", "maintenance", "aggregation"),
        default="all",
        help="aggregation has a queue of its own, so that a big job cannot starve the tick "
        "(docs/deploy.md)",
    )
    w.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve this host's metrics on GPUFLEX_METRICS_ADDR (127.0.0.1):PORT, for a host "
        "without a web server (docs/deploy.md, Observability)",
    )
    w.set_defaults(func=cmd_worker)

    b = sub.add_parser("beat", help="run the periodic tick's clock alone (one per deployment)")
    b.add_argument("--loglevel", default="INFO")
    b.set_defaults(func=cmd_beat)

    n = sub.add_parser(
        "nginx-config", help="print the nginx server block to put in front of `serve`"
    )
    n.add_argument("--listen", default="80", help="nginx's listen address (default 80)")
    n.add_argument(
        "--upstream",
        action="append",
        help="a `serve --bind` address; repeat it for several web servers (default 127.0.0.1:8000)",
    )
    n.add_argument("--server-name", default="_")
    n.set_defaults(func=cmd_nginx_config)

    st = sub.add_parser(
        "settings",
        help="check the server's environment and print its settings (--markdown: their reference)",
    )
    st.add_argument("--markdown", action="store_true", help="the reference table, Markdown")
    st.add_argument(
        "--write", metavar="DOC", help="rewrite DOC's generated table (docs/settings.md)"
    )
    st.set_defaults(func=cmd_settings)

    m = sub.add_parser("manage", help="Django management commands", add_help=False)
    m.add_argument("rest", nargs=argparse.REMAINDER)
    m.set_defaults(func=cmd_manage)

    j = sub.add_parser("submit", help="submit a job spec (YAML or JSON)")
    j.add_argument("spec")
    j.add_argument(
        "--dataset",
        help="the spec's dataset file (CSV, NPZ, Parquet, an image archive, text or JSONL); by "
        "default the files the spec names beside it are uploaded with it; a large dataset goes "
        "as a chunked upload with a progress bar, and a rerun after an interruption resumes it",
    )
    j.add_argument("--tier", choices=["volunteer", "hybrid", "platform"], default="hybrid")
    j.add_argument(
        "--budget", required=True, help="credits to hold in escrow; unspent credit comes back"
    )
    j.add_argument(
        "--max-price",
        default=None,
        help="the most a node may ask per GPU-hour (default: the market's price, the median "
        "asking price of the online nodes that fit the job)",
    )
    j.add_argument(
        "--federated", metavar="NAME",
        help="federated: train on the nodes' local dataset NAME, which never leaves them "
        "(the spec's dataset is only evaluated on); see docs/federated.md",
    )  # fmt: skip
    j.add_argument(
        "--checkpoint", metavar="FILE",
        help="the safetensors file model.checkpoint names: a training job's initial weights, "
        "or the model an evaluate or inference job scores",
    )  # fmt: skip
    j.add_argument("--model-config", metavar="FILE", help="an hf_* model's config.json")
    j.add_argument("--follow", action="store_true", help="show progress until the job ends")
    j.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)
    j.set_defaults(func=cmd_submit)

    u = sub.add_parser(
        "upload", help="upload a large dataset in resumable chunks; prints the upload id"
    )
    u.add_argument("file")
    u.set_defaults(func=cmd_upload)

    jobs = sub.add_parser("jobs", help="list your jobs (or: jobs export JOB --to TRACKER)")
    jobs.set_defaults(func=cmd_jobs)
    jobs_sub = jobs.add_subparsers(dest="jobs_command")
    x = jobs_sub.add_parser(
        "export", help="log a job's params, per-round metrics and model to a tracker"
    )
    x.add_argument("job", help="the job's id, or its first characters")
    x.add_argument("--to", choices=["mlflow", "tensorboard", "wandb"], required=True)
    x.add_argument(
        "--target",
        help="mlflow: tracking URI (default file:./mlruns); tensorboard: log folder (default "
        "runs/JOB); wandb: folder for the offline run (default .)",
    )
    x.set_defaults(func=cmd_jobs_export)
    for action, what in (("cancel", "cancel a job: it ends, and its unspent escrow returns"),
                         ("pause", "pause a job: no new work is leased until it resumes"),
                         ("resume", "resume a paused job")):  # fmt: skip
        a = jobs_sub.add_parser(action, help=what)
        a.add_argument("job", help="the job's id, or its first characters (8, as the web shows)")
        a.set_defaults(func=cmd_jobs_action)

    ex = sub.add_parser("examples", help="write the files the examples/ specs train on")
    ex_sub = ex.add_subparsers(dest="examples_command", required=True)
    w = ex_sub.add_parser(
        "write",
        help="the stdlib corpus (stdlib.jsonl) and a tiny GPT-2 (config and generated weights) "
        "for examples/stdlib-lm.yaml and examples/lora-finetune.yaml",
    )
    w.add_argument("folder", help="where to write them (the examples/ folder)")
    w.add_argument("--corpus-bytes", default=str(2 * 2**20), help="source bytes of the corpus")
    w.set_defaults(func=cmd_examples_write)

    e = sub.add_parser("demo", help="run the marketplace, five agents and a job on this machine")
    e.add_argument("--json", action="store_true", help="print the summary as JSON (last line)")
    e.add_argument("--serve", action="store_true", help="keep the web UI and API up afterwards")
    e.add_argument("--data-dir", default=".gpuflex-demo", help="the demo's folder (recreated)")
    e.add_argument("--port", type=int, default=0, help="web server port (default: a free one)")
    e.add_argument("--target", type=float, default=0.95, help="test accuracy to train to")
    e.add_argument("--budget", default="1.00", help="the buyer's budget for the job")
    e.add_argument("--timeout", type=float, default=900.0, help=argparse.SUPPRESS)
    e.add_argument("--chain", action="store_true",
                   help="settle on a Hardhat node it starts; print settlement latency")  # fmt: skip
    e.set_defaults(func=cmd_demo)

    xm = sub.add_parser(
        "export-model",
        help="a PyTorch model and loss as a torch.export program (.pt2), for model.arch: exported",
    )
    xm.add_argument("target", help="module:attr, an nn.Module or what makes one")
    xm.add_argument(
        "--example", action="append", default=[], required=True,
        help="dtype[shape] of the inputs, then again of the targets, e.g. float32[8,64]",
    )  # fmt: skip
    xm.add_argument(
        "--loss", default="cross_entropy",
        help="cross_entropy, mse, l1, binary_cross_entropy_with_logits, or module:attr",
    )  # fmt: skip
    xm.add_argument("--loss-only", action="store_true", help="return the loss without logits")
    xm.add_argument("-o", "--output", default="model.pt2")
    xm.set_defaults(func=cmd_export_model)

    d = sub.add_parser("download", help="download a job's model and provenance record")
    d.add_argument("job", help="the job's id, or its first characters")
    d.add_argument("-o", "--output", default=".")
    d.add_argument(
        "--format",
        choices=["safetensors", "hf", "onnx", "torchscript", "pt2"],
        default="safetensors",
        help="hf: a Hugging Face folder (transformer models only); pt2: an exported model's "
        "program with the trained weights (model.arch: exported only)",
    )
    d.add_argument(
        "--wait", type=_seconds, default=EXPORT_WAIT_S, metavar="SECONDS",
        help="how long to wait for the server to make an onnx, torchscript or hf export on "
        "first request (default %(default).0f)",
    )  # fmt: skip
    d.set_defaults(func=cmd_download)

    v = sub.add_parser(
        "verify", help="check a job's model against the chain (model, provenance, anchor)"
    )
    v.add_argument("job", help="the job's id, or its first characters")
    v.add_argument("--chain-url", default="", help="JSON-RPC URL (env GPUFLEX_CHAIN_URL)")
    v.add_argument("-o", "--output", default=".", help="where the download goes")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_verify)

    wd = sub.add_parser(
        "withdraw", help="withdraw unspent on-chain deposits (no AMOUNT: list withdrawals)"
    )
    wd.add_argument("amount", nargs="?", default=None)
    wd.add_argument("--key", default="", help="idempotency key (default: a fresh one)")
    wd.set_defaults(func=cmd_withdraw)

    wf = sub.add_parser("withdraw-fees", help="operators: withdraw platform fees on chain")
    wf.add_argument("amount")
    wf.add_argument("--to", required=True, help="the wallet address")
    wf.add_argument("--key", default="", help="idempotency key (default: a fresh one)")
    wf.set_defaults(func=cmd_withdraw_fees)

    pr = sub.add_parser("proof", help="the Merkle proof to claim a payout or withdrawal")
    pr.add_argument("payout", type=int)
    pr.set_defaults(func=cmd_proof)

    c = sub.add_parser("contributions", help="a node's contribution proofs, per batch")
    c.add_argument("node", type=int)
    c.add_argument("--batch", default=None)
    c.add_argument("--check", action="store_true", help="verify each proof (on chain too)")
    c.add_argument("--chain-url", default="", help="JSON-RPC URL for --check on chain")
    c.set_defaults(func=cmd_contributions)

    r = sub.add_parser("predictions", help="download an inference job's predictions (Parquet)")
    r.add_argument("job", help="the job's id, or its first characters")
    r.add_argument("-o", "--output", default=None, help="default JOB.predictions.parquet")
    r.set_defaults(func=cmd_predictions)
    return p


def main(argv: list[str] | None = None) -> int:
    """Every failure is one line on stderr and an exit status, never a traceback: 2 for a
    mistake (the command's, its files', the server's answer), 130 when interrupted, 141
    (as a shell reports SIGPIPE) when the reader of our output went away (`| head`)."""
    args = parser().parse_args(argv)
    try:
        if args.command in SERVER_COMMANDS:
            check_server_settings()
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit past our handler
        return status
    except GPUFlexError as exc:
        print(f"gpuflex: {exc.detail} ({exc.status} {exc.code})", file=sys.stderr)
        return 2
    except httpx.TransportError as exc:
        url = server_url(getattr(args, "server", None))
        print(f"gpuflex: cannot reach the marketplace at {url} ({exc or type(exc).__name__}); "
              "point the CLI at yours with --server URL or GPUFLEX_SERVER=URL",
              file=sys.stderr)  # fmt: skip
        return 2
    except CliError as exc:
        print(f"gpuflex {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except OSError as exc:  # a file it could not read or write
        where = f": {exc.filename}" if exc.filename else ""
        print(f"gpuflex {args.command}: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gpuflex {args.command}: interrupted", file=sys.stderr)
        return 130


def _silence_stdout() -> None:
    """Whatever is still buffered for a closed pipe goes nowhere, so the interpreter's own
    flush at exit does not fail with a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (a test's capture): nothing to silence


if __name__ == "__main__":
    sys.exit(main())
