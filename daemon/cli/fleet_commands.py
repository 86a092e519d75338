"""`flare-diag fleet ...`: set up the fleet database, set pools, ship a log, and read what the fleet holds."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path

from flare_diag.daemon.cli.common import EXIT_FAILED, EXIT_OK, UsageError, ranged


def add_parser(sub, parser_class) -> None:
    fl = sub.add_parser("fleet", help="the fleet database: init, pools, leases, shipping, status, verify",
                        description="The fleet's PostgreSQL (docs/fleet.md). Every command takes --dsn (a libpq "
                                    "connection string without a password) or --config (a daemon's fleet file); a "
                                    "password comes from --password-file or $CREDENTIALS_DIRECTORY/fleet-password, "
                                    "never from the command line.")
    fsub = fl.add_subparsers(dest="fleet_cmd", required=True, parser_class=parser_class)
    conn_flags = _conn_flags
    init = fsub.add_parser("init", help="apply the fleet's migrations (plain versioned SQL files) to a database")
    init.add_argument("dsn_arg", metavar="DSN", nargs="?", default=None, help="the database (or --dsn/--config)")
    conn_flags(init)
    pool = fsub.add_parser("pool", help="pools of primaries")
    psub = pool.add_subparsers(dest="pool_cmd", required=True, parser_class=parser_class)
    ps = psub.add_parser("set", help="create a pool or change how many of its primaries may be down at once")
    ps.add_argument("pool", help="the pool's name")
    ps.add_argument("--max-down", type=ranged("--max-down"), required=True, metavar="K", help="at most K primaries of the pool down at once")
    conn_flags(ps)
    ls = fsub.add_parser("lease", help="pool leases")
    lsub = ls.add_subparsers(dest="lease_cmd", required=True, parser_class=parser_class)
    lr = lsub.add_parser("release", help="free a host's lease by hand (after a person restored it), logged with the caller")
    lr.add_argument("host", help="the host whose lease to free")
    lr.add_argument("--reason", required=True, help="why (kept in the fleet's lease log)")
    conn_flags(lr)
    hs = fsub.add_parser("host", help="hosts' login roles")
    hsub = hs.add_subparsers(dest="host_cmd", required=True, parser_class=parser_class)
    ha = hsub.add_parser("add", help="create a host's login role (a member of flare_diag_host, writing only its own "
                                     "rows) and print the dsn line for its fleet file; needs CREATEROLE")
    ha.add_argument("host", help="the host's name, as its fleet file's `host` (the role is named the same)")
    conn_flags(ha)
    sh = fsub.add_parser("ship", help="ship a log's events not yet in the fleet (what flare-diagd does continuously)")
    sh.add_argument("log", type=Path, help="the host's log.db")
    sh.add_argument("--host", default=None, help="the host's id (default: the config's)")
    sh.add_argument("--pool", default=None, help="the host's pool (default: the config's)")
    conn_flags(sh)
    _add_campaign(fsub, parser_class, conn_flags)
    _add_reads(fsub)


def _conn_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", default=None, help="libpq connection string or URI, without a password")
    p.add_argument("--config", type=Path, default=None, help="a fleet file (dsn, host, pool) instead of --dsn")
    p.add_argument("--password-file", default="", help="a file holding the database password")


def _add_reads(fsub) -> None:  # noqa: ANN001  (argparse's subparsers action has no public type)
    """The fleet's reads: status, windows, a window's report, a host's chain verified."""
    conn_flags = _conn_flags
    st = fsub.add_parser("status", help="per pool: K and who is down now; per host: head, shipping, running window, lease")
    st.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    conn_flags(st)
    wl = fsub.add_parser("windows", help="windows across the fleet, newest first")
    wl.add_argument("--host", default=None, help="only this host's windows")
    wl.add_argument("--plan", default=None, help="only windows of this plan (its name)")
    wl.add_argument("--verdict", default=None, help="only windows with this verdict (e.g. row_checkpoint_churn)")
    wl.add_argument("--since", default=None, type=_iso_time, help="an ISO 8601 date or time")
    wl.add_argument("--json", action="store_true", help="one JSON object per line")
    conn_flags(wl)
    rp = fsub.add_parser("report", help="a window's report rebuilt from the fleet's events (the host's own, byte for byte)")
    rp.add_argument("window", help="the window id")
    rp.add_argument("--format", choices=["json", "md", "html"], default="json", help="the report's format")
    conn_flags(rp)
    vf = fsub.add_parser("verify", help="a host's shipped chain recomputed, and its local log checked against it",
                         description="Exit 0: the fleet's chain holds and the local log (when given) agrees with it; 1: the "
                                     "first differing seq is named; 2: bad input.")
    vf.add_argument("host", help="the host's id")
    vf.add_argument("--log", type=Path, default=None, help="the host's local log.db to check against the fleet")
    vf.add_argument("--json", action="store_true", help="one JSON object instead of a line")
    conn_flags(vf)



def _add_campaign(fsub, parser_class, conn_flags) -> None:
    """`fleet campaign create|cancel|requeue|show`."""
    cp = fsub.add_parser("campaign", help="one plan queued on several hosts, each run claimed by its host's daemon")
    csub = cp.add_subparsers(dest="campaign_cmd", required=True, parser_class=parser_class)
    cc = csub.add_parser("create", help="queue a plan's runs on hosts (repeats run side by side, repeat by repeat)")
    cc.add_argument("--plan", type=Path, required=True, help="the plan (TOML); its content is stored, checked by hash")
    cc.add_argument("--site", required=True, help="the site's name in each host's own sites directory")
    cc.add_argument("--hosts", required=True, help="comma-separated host ids")
    cc.add_argument("--repeats", type=ranged("--repeats"), default=1, help="runs per host (default 1; a follow-on plan's order sets it)")
    cc.add_argument("--candidate-site", default=None,
                    help="with a follow-on plan: the site whose candidate recipe is the policy's build (its "
                         "candidate runs go there, the baseline's to --site)")
    cc.add_argument("--time-scale", type=float, default=1.0, help="for simulated sites only (default 1)")
    cc.add_argument("--accept-partial", action="store_true", help="start even if the forecast says required cells do not fit")
    cc.add_argument("--retries", type=ranged("--retries"), default=2,
                    help="how often a run whose claim expired (its daemon stopped renewing it) is queued again before "
                         "it fails (default 2)")
    cc.add_argument("--visibility-s", type=ranged("--visibility-s", float), default=120.0,
                    help="seconds a claimed run stays its daemon's without a renewal (every daemon renews every 5 s; "
                         "default 120)")
    conn_flags(cc)
    for name, what in (("cancel", "cancel every run of a campaign not started yet (queued or claimed)"),
                       ("requeue", "queue a campaign's failed, refused or cancelled runs again (attempts from zero)")):
        sp = csub.add_parser(name, help=what)
        sp.add_argument("campaign", type=int, help="the campaign's number")
        if name == "requeue":
            sp.add_argument("--run", type=int, default=None, help="only this run")
        conn_flags(sp)
    cs = csub.add_parser("show", help="every run of a campaign: state, window, outcome, verdict, restoration, report")
    cs.add_argument("campaign", type=int, help="the campaign's number")
    cs.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    conn_flags(cs)


def _iso_time(text: str) -> str:
    from datetime import datetime
    try:
        datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an ISO 8601 date or time (2026-12-01, "
                                         f"2026-12-01T08:00+00:00)") from None
    return text


def _dsn(args: argparse.Namespace):
    from flare_diag.daemon.fleet.dsn import FleetError, conninfo
    try:
        cfg = None
        if args.config:  # the settings file's reader (msgspec) loads only when one is named
            from flare_diag.daemon.fleet.config import load_config
            cfg = load_config(args.config)
        dsn = getattr(args, "dsn_arg", None) or args.dsn or (cfg.dsn if cfg else None)
        if not dsn:
            raise UsageError("fleet: give the database as --dsn DSN or --config FILE")
        return conninfo(dsn, args.password_file or (cfg.password_file if cfg else "")), cfg
    except FleetError as exc:
        raise UsageError(f"fleet: {exc}") from None


def _caller() -> str:
    try:
        name = getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid: the uid says who
        name = "?"
    return f"{name} (uid {os.getuid()})"


def run_fleet(args: argparse.Namespace) -> int:
    from flare_diag.daemon.fleet.dsn import FleetError
    dsn, cfg = _dsn(args)
    try:
        if args.fleet_cmd in _READS:  # blocking, without the event loop or psycopg: they must start fast
            return _READS[args.fleet_cmd](args, dsn)
        import anyio
        return anyio.run(_run, args, dsn, cfg)
    except FleetError as exc:
        raise UsageError(f"fleet: {exc}") from None
    except Exception as exc:
        psycopg = sys.modules.get("psycopg")  # loaded by every command that reaches the database through it
        if psycopg is None or not isinstance(exc, psycopg.Error):
            raise
        from flare_diag.daemon.fleet.db import one_line
        from flare_diag.daemon.fleet.dsn import redact  # the server's words, never the DSN's password
        raise UsageError(f"fleet: fleet database {redact(dsn)}: {one_line(exc)}") from None


async def _run(args: argparse.Namespace, dsn: str, cfg) -> int:
    return await _COMMANDS[args.fleet_cmd](args, dsn, cfg)


async def _init(args: argparse.Namespace, dsn: str, cfg) -> int:
    from flare_diag.daemon.fleet.db import migrate
    applied = await migrate(dsn)
    print(f"applied {', '.join(applied)}" if applied else "up to date: nothing to apply")
    return EXIT_OK


async def _pool(args: argparse.Namespace, dsn: str, cfg) -> int:
    from flare_diag.daemon.fleet.config import check_name
    from flare_diag.daemon.fleet.db import connect
    check_name("pool", args.pool)
    async with await connect(dsn) as conn:
        async with conn.transaction():
            await conn.execute("INSERT INTO pools (pool, max_down) VALUES (%s, %s) ON CONFLICT (pool) DO UPDATE "
                               "SET max_down = EXCLUDED.max_down", (args.pool, args.max_down))
    print(f"pool {args.pool}: at most {args.max_down} down at once")
    return EXIT_OK


async def _lease(args: argparse.Namespace, dsn: str, cfg) -> int:
    from flare_diag.daemon.fleet import lease
    from flare_diag.daemon.fleet.db import connect
    async with await connect(dsn) as conn:
        freed = await lease.release(conn, args.host, _caller(), args.reason)
    print(f"{args.host}: lease released" if freed else f"{args.host}: held no lease")
    return EXIT_OK if freed else EXIT_FAILED


async def _host(args: argparse.Namespace, dsn: str, cfg) -> int:
    from flare_diag.daemon.fleet.config import check_name
    from flare_diag.daemon.fleet.db import add_host
    print(await add_host(dsn, check_name("host", args.host)))
    return EXIT_OK


async def _ship(args: argparse.Namespace, dsn: str, cfg) -> int:
    from flare_diag.daemon.fleet.config import check_name
    from flare_diag.daemon.fleet.db import connect
    from flare_diag.daemon.fleet.shipper import ship_once
    host = args.host or (cfg.host if cfg else None)
    pool = args.pool or (cfg.pool if cfg else None)
    if not host or not pool:
        raise UsageError("fleet ship: give --host and --pool, or --config")
    if not args.log.is_file():
        raise UsageError(f"{args.log}: no such log file")
    n = 0
    async with await connect(dsn) as conn:
        while (res := await ship_once(conn, check_name("host", host), check_name("pool", pool), args.log,
                                      cfg.batch if cfg else 2000)).events:
            n += res.events
    print(f"{host}: shipped {n} events; the fleet holds up to seq {res.head_seq}")
    return EXIT_OK


def _status(args: argparse.Namespace, dsn: str) -> int:
    from flare_diag.daemon.fleet.reads import status_now
    st = status_now(dsn)
    if args.json:
        print(json.dumps(st))
        return EXIT_OK
    for p in st["pools"]:
        who = ", ".join(f"{h['host']} ({h['window_id']}, {h['state']})" for h in p["held_by"]) or "none"
        print(f"pool {p['pool']}: {p['down']} of {p['max_down']} down: {who}")
    for h in st["hosts"]:
        lease_txt = f"lease {h['lease']['window_id']} ({h['lease']['state']})" if h["lease"] else "no lease"
        print(f"host {h['host']} ({h['pool']}): head {h['head_seq']}:{(h['head_hash'] or '')[:16]}, last event "
              f"{h['last_event_at'] or '-'}, running {h['running_window'] or '-'}, {lease_txt}")
    for a in st["alarms"]:
        print(f"ALARM {a['at']} {a['host']} {a['kind']}: {a['detail']}")
    return EXIT_OK


def _windows(args: argparse.Namespace, dsn: str) -> int:
    from flare_diag.daemon.fleet.reads import windows_now
    for r in windows_now(dsn, args.host, args.plan, args.verdict, args.since):
        if args.json:
            print(json.dumps(r))
            continue
        restored = {True: "restoration verified", False: "restoration NOT verified", None: "-"}[r["restoration_verified"]]
        print(f"{r['window_id']}  {r['host']}  {r['opened_at'] or '-'}  {r['outcome'] or 'OPEN'}  "
              f"verdict {r['verdict'] or '-'}  {restored}")
    return EXIT_OK


async def _report(args: argparse.Namespace, dsn: str, cfg) -> int:
    import sys

    from flare_diag.daemon.fleet import views
    from flare_diag.daemon.reports.publish import render
    rep = await views.report(dsn, args.window)
    sys.stdout.buffer.write(render(rep, args.format))
    sys.stdout.flush()
    it = rep["integrity"]
    return EXIT_OK if it["chain_ok"] and it["audit_ok"] else EXIT_FAILED


async def _verify(args: argparse.Namespace, dsn: str, cfg) -> int:
    from flare_diag.daemon.fleet import views
    res = await views.verify_host(dsn, args.host, args.log)
    if args.json:
        print(json.dumps(res))
    elif res["ok"]:
        print(f"ok: {args.host}'s chain holds to seq {res['central_head_seq']}"
              + ("; the local log agrees" if args.log else ""))
    else:
        print(f"{args.host}: {res['problem']}" + (f" (first differing seq {res['first_differing_seq']})"
                                                 if res["first_differing_seq"] else ""))
    return EXIT_OK if res["ok"] else EXIT_FAILED


async def _campaign(args: argparse.Namespace, dsn: str) -> int:
    """`fleet campaign ...`: create, cancel, requeue, show."""
    from flare_diag.daemon.fleet import campaigns
    if args.campaign_cmd == "create":
        try:
            raw = args.plan.read_bytes()
        except OSError as exc:
            raise UsageError(f"{args.plan}: cannot be read ({exc.strerror or exc})") from None
        from flare_diag.policies.plan import PlanError, decode_plan
        try:
            plan = decode_plan(raw, str(args.plan))
        except PlanError as exc:
            raise UsageError(str(exc)) from None
        order = list(plan.follow_on.order) if plan.follow_on and plan.follow_on.stage == "policy" else None
        cid = await campaigns.create(dsn, raw.decode(), plan.name, args.site, [h for h in args.hosts.split(",") if h],
                                     args.repeats, args.time_scale, args.accept_partial, _caller(), order,
                                     args.candidate_site, args.retries, args.visibility_s)
        print(f"campaign {cid}: {plan.name} on {args.hosts} x{args.repeats}")
        return EXIT_OK
    if args.campaign_cmd == "cancel":
        n = await campaigns.cancel(dsn, args.campaign, _caller())
        print(f"campaign {args.campaign}: {n} runs cancelled")
        return EXIT_OK
    if args.campaign_cmd == "requeue":
        n = await campaigns.requeue(dsn, args.campaign, _caller(), args.run)
        print(f"campaign {args.campaign}: {n} runs queued again")
        return EXIT_OK if n else EXIT_FAILED
    shown = await campaigns.show(dsn, args.campaign)
    if args.json:
        print(json.dumps(shown))
        return EXIT_OK
    s = shown["summary"]
    print(f"campaign {shown['campaign']}: {shown['plan']} (sha256 {shown['plan_sha256'][:16]}) on site "
          f"{shown['site']}: {s['done']} of {s['runs']} runs done, {s['restorations_verified']} restorations "
          f"verified, verdicts {', '.join(s['verdicts']) or '-'}{' (all agree)' if s['verdicts_agree'] else ''}")
    for host, acc in (shown["acceptance"] or {}).items():
        print(f"  {host}: {acc['reason']}")
    for r in shown["runs"]:
        print(f"  run {r['run']:>3}  {r['host']}  repeat {r['repeat']}{' ' + r['side'] if r['side'] else ''}  "
              f"{r['state']:8}  {r['window_id'] or '-'}  "
              f"{r['outcome'] or '-'}  verdict {r['verdict'] or '-'}  "
              f"restoration {'verified' if r['restoration_verified'] else '-' if r['restoration_verified'] is None else 'NOT verified'}"
              + (f"  ({r['detail']})" if r["detail"] and r["state"] != "done" else ""))
    return EXIT_OK


_COMMANDS = {"init": _init, "pool": _pool, "lease": _lease, "host": _host, "ship": _ship,
             "campaign": lambda args, dsn, _cfg: _campaign(args, dsn), "report": _report,
             "verify": _verify}  # `fleet CMD`: the function that runs it
_READS = {"status": _status, "windows": _windows}  # the reads that run without the event loop
