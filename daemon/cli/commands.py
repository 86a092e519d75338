"""The `flare-diag` command line: offline tools and the client of the daemon's control socket."""

from __future__ import annotations

from collections.abc import Callable
import argparse
import contextlib
import math
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from flare_diag.resources import resource
from flare_diag.daemon.cli.common import (
    EXIT_BAD_INPUT, EXIT_BUSY, EXIT_CODES, EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, UsageError, integrity_warning,
    make_console, one_line, ranged,
)

if TYPE_CHECKING:  # the plan's type, for the annotations only: the parser loads no policy
    from flare_diag.policies.plan import Plan


class _Help(argparse.HelpFormatter):
    """Every option's help ends with its default, when it has one worth saying and does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        h = action.help or ""
        d = action.default
        if "default" in h or d in (None, False, [], argparse.SUPPRESS) or not action.option_strings:
            return h
        return h + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line, not the usage block
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _with_socket(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A command that talks to the daemon: its --socket flag."""
    sp.add_argument("--socket", type=Path, default=None,
                    help="the daemon's control socket (default: $FLARE_DIAG_SOCKET, else /run/flare-diagd/control.sock)")
    return sp


def _add_service_commands(sub) -> Callable[[argparse.ArgumentParser], argparse.ArgumentParser]:  # noqa: ANN001
    """status, start, abort, watch and report: the commands of the daemon's control socket (report reads a
    log offline too). Returns the helper that gives a command its --socket flag."""
    sock = _with_socket
    st = sock(sub.add_parser("status", help="the daemon's state and the current window's progress"))
    st.add_argument("--json", action="store_true", help="print the raw status reply")
    sa = sock(sub.add_parser("start", help="start a window in the daemon"))
    sa.add_argument("plan", type=Path, help="the window's plan (TOML), read here and sent as content")
    sa.add_argument("--site", required=True, metavar="NAME",
                    help="a site profile installed in the daemon's sites directory (NAME.toml there)")
    sa.add_argument("--time-scale", type=float, default=1.0, help="window seconds per wall second (a simulated site)")
    _forecast_flags(sa)
    ab = sock(sub.add_parser("abort", help="abort the running window (it restores, then closes)"))
    ab.add_argument("--reason", required=True, help="why, in words: it goes into the log and the report")
    wa = sock(sub.add_parser("watch", help="follow the current window live until it closes"))
    wa.add_argument("--from-seq", type=ranged("--from-seq"), default=None, help="replay the log from this seq before following it live")
    wa.add_argument("--json", action="store_true", help="JSON lines: every event as it is logged, nothing else")
    rp = sock(sub.add_parser("report", help="a window's report: from a log file (offline) or from the daemon",
                             description="report DB [--window ID] | report WINDOW_ID (daemon) | "
                                         "report compare DB --windows A B C --baseline X [Y Z]"))
    rp.add_argument("target", help="a log file (offline), a window id (asks the daemon), or 'compare'")
    rp.add_argument("db", nargs="?", type=Path, default=None,
                    help="with compare: the log file holding the windows (optional when every window is given as the path "
                         "of its own log or out folder)")
    rp.add_argument("--window", default=None, help="offline: the window (default: the last one in the log)")
    rp.add_argument("--format", choices=["json", "md", "html"], default="md", help="the report's format")
    rp.add_argument("--out", type=Path, default=None,
                    help="offline: publish a dated snapshot under DIR/<window>/<UTC date>-<n>/; daemon: write to FILE")
    rp.add_argument("--windows", nargs="+", default=None,
                    help="with compare: the candidate's repeats (window ids, or paths of their own logs or out folders)")
    rp.add_argument("--baseline", nargs="+", default=None, help="with compare: the baseline's repeats (the same forms)")
    rp.add_argument("--repeats", type=ranged("--repeats"), default=3, help="with compare: the repeats a side the rule uses, exactly (default 3)")
    rp.add_argument("--json", action="store_true", help="with compare: one JSON object instead of lines")
    return sock


def _add_rehearse(sub, scenarios: str, fault_kinds) -> argparse.ArgumentParser:  # noqa: ANN001 - argparse's own
    """`flare-diag rehearse`'s own flags (the forecast's and --json are shared with `run`)."""
    rh = sub.add_parser("rehearse", help="run a whole window against the embedded simulator")
    if isinstance(rh, _Skipped):  # another command's call: not even the shipped plan's path is looked up
        return rh  # type: ignore[return-value]  # _Skipped stands in for a parser: it takes every call one would
    rh.add_argument("--plan", type=Path, default=resource("flare_diag.fixtures", "plans", "2026-10-22-cache-diagnosis.toml"),
                    help="the window's plan (TOML); default: the shipped 2026-10-22 plan")
    rh.add_argument("--scenario", default="flare-47581cca", help=f"the simulated host: {scenarios}")
    rh.add_argument("--fault", action="append", default=[],
                    help="inject a fault, repeatable: KIND[@PHASE#N|@request=N|@after_request=N|@after_s=X|@before_load=N|@after_load=N][,param=value]; "
                         "PHASE#N: as the window sends PHASE's request #N (its order from 0, as the report numbers "
                         "requests: B.forward_replay#12); request=N: the host's "
                         "N-th chat request from now, probes and preflights counted; before_load/after_load=N: as the "
                         "N-th load from now begins / completes; none: at once. The report lists each fault and "
                         f"whether it fired. KIND is one of {', '.join(fault_kinds)}")
    rh.add_argument("--out", type=Path, default=None, help="where the log and reports go (default: out/rehearsal-<UTC>)")
    rh.add_argument("--time-scale", type=_scale_or_auto, default=None,
                    help="pace the rehearsal on the wall clock at this factor (a live demonstration), or 'auto': the "
                         "fastest up to x20 this machine can keep now with headroom for its load rising (said when "
                         "chosen); default: virtual time, as fast as the machine computes it")
    rh.add_argument("--seed", type=int, default=0, help="the simulator's service-time noise (default 0)")
    rh.add_argument("--candidate", default="glm-candidate", metavar="RECIPE",
                    help="the simulated host's recipe the window loads as its candidate: glm-candidate, or a policy "
                         "build glm-candidate-POLICY (lru_leaf, marconi, protect_full_prompt) for a follow-on's sides "
                         "(default glm-candidate)")
    return rh


def _add_run(sub) -> argparse.ArgumentParser:
    """`flare-diag run`'s own flags (the forecast's and --json are shared with `rehearse`)."""
    rn = sub.add_parser("run", help="run a window against a site")
    rn.add_argument("--plan", type=Path, default=None, help="the window's plan (TOML)")
    rn.add_argument("--site", type=Path, default=None, help="the site profile (TOML)")
    rn.add_argument("--out", type=Path, default=None, help="where the log and reports go (a new folder)")
    rn.add_argument("--resume", type=Path, default=None, metavar="OUT",
                    help="pick up the window a foreground run left open in OUT (killed, or its session lost) "
                         "and restore the incumbent")
    rn.add_argument("--time-scale", type=float, default=1.0,
                    help="window seconds per wall second (a site whose clock runs faster, as a simulator's may)")
    rn.add_argument("--reviews", type=Path, default=None, metavar="LOG",
                    help="the log holding the plan's review (`flare-diag review sign PLAN --by NAME --log LOG`): a "
                         "production plan runs only with a review of its exact bytes by someone other than its author")
    return rn


class _Skipped:
    """A command's parser when another command was asked for: takes every call, builds nothing."""

    def __getattr__(self, _name: str):  # noqa: ANN204 - add_argument, add_subparsers, set_defaults...
        return self._anything

    def _anything(self, *_args, **_kwargs) -> _Skipped:
        return self


class _Only:
    """The command subparsers with only `name`'s parser built: a call's start-up pays for one command's
    parser, not fifty (`found`: whether `name` is a command at all)."""

    def __init__(self, sub, name: str) -> None:  # noqa: ANN001 - argparse's private action class
        self.sub, self.name, self.found = sub, name, False

    def add_parser(self, name: str, **kwargs):  # noqa: ANN201
        if name != self.name:
            return _Skipped()
        self.found = True
        return self.sub.add_parser(name, **kwargs)


_SCENARIO_COMMANDS = ("rehearse", "sim", "reproduce", "plan")  # the commands whose help names the simulator's lists


def _add_log_commands(sub) -> None:  # noqa: ANN001 - argparse's subparsers action
    """log verify, export, audit, state, archive and backup: the event log's own tools."""
    log = sub.add_parser("log", help="verify, audit, replay to a state, export, archive or back up an event log")
    lsub = log.add_subparsers(dest="log_cmd", required=True, parser_class=_Parser)
    v = lsub.add_parser("verify", help="recompute the hash chain")
    v.add_argument("db", type=Path, help="the event log (log.db)")
    v.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint file (default: DB.checkpoint when present)")
    v.add_argument("--anchor", default=None, metavar="REPORT.json|SEQ:HASH",
                   help="a head published outside the log (a window's report.json, or SEQ:HASH from the journal)")
    v.add_argument("--key", type=Path, default=None,
                   help="the checkpoint signing key: the checkpoint must carry a signature that verifies under it")
    e = lsub.add_parser("export", help="write the log as JSON lines")
    e.add_argument("db", type=Path, help="the event log (log.db)")
    au = lsub.add_parser("audit", help="replay recorded inputs and compare the decisions")
    au.add_argument("db", type=Path, help="the event log (log.db)")
    st = lsub.add_parser("state", help="replay a window's inputs and print what its decider holds",
                         description="Replays one window's recorded inputs (up to --at) into this build's decider, "
                                     "holding each recorded decision to its own, and prints the decider's state there: "
                                     "stage, clock, cells, outstanding actions, abort, watches and restore.")
    st.add_argument("db", type=Path, help="the event log (log.db)")
    st.add_argument("--window", default=None, metavar="ID", help="the window (default: the log's latest)")
    when = st.add_mutually_exclusive_group()
    when.add_argument("--at", type=ranged("--at"), default=None, metavar="SEQ",
                      help="after the window's inputs up to this seq (default: all of them)")
    when.add_argument("--minute", type=ranged("--minute", float), default=None, metavar="M",
                      help="after the window's inputs up to window minute M (minute 0: the take-down)")
    for lp in (v, au, st):
        lp.add_argument("--json", action="store_true", help="one JSON object instead of a line")
    ar = lsub.add_parser("archive", help="move windows closed before a date into a dated archive log",
                         description="Both logs verify on their own afterwards; the live log records the archive's "
                                     "head hash. Without DB the daemon archives its own log into its state directory "
                                     "(between windows); with DB the log must not be in use by another process.")
    ar.add_argument("db", nargs="?", type=Path, default=None,
                    help="the event log (log.db); default: the daemon's, archived by the daemon itself")
    ar.add_argument("--before", required=True, metavar="YYYY-MM-DD",
                    help="move the leading windows that closed before this day (UTC)")
    ar.add_argument("--to", type=Path, default=None, metavar="DIR",
                    help="with DB: the folder the archive log is written to (the daemon uses $STATE_DIRECTORY/archive)")
    ar.add_argument("--key", type=Path, default=None,
                    help="the checkpoint signing key: both logs' checkpoints are signed with it (as the daemon signs)")
    ar.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    ar.add_argument("--socket", type=Path, default=None,
                    help="without DB: the daemon's control socket (default: $FLARE_DIAG_SOCKET, else /run/flare-diagd/control.sock)")
    bk = lsub.add_parser("backup", help="copy a log that may be in use (SQLite's online backup API) and verify the copy")
    bk.add_argument("db", type=Path, help="the event log (log.db)")
    bk.add_argument("dest", type=Path, help="the copy to write (never over an existing file); its checkpoint goes beside it")


def _add_sim_commands(sub, scenarios: str) -> None:  # noqa: ANN001 - argparse's subparsers action
    """sim serve and sim replay: the simulated Flare host."""
    sim = sub.add_parser("sim", help="the simulated Flare host")
    ssub = sim.add_subparsers(dest="sim_cmd", required=True, parser_class=_Parser)
    ss = ssub.add_parser("serve", help="serve flaresim on loopback")
    ss.add_argument("--port", type=int, default=8100, help="the loopback port (0: any free one)")
    ss.add_argument("--scenario", default="flare-47581cca", help=f"the simulated host: {scenarios}")
    ss.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per wall second")
    ss.add_argument("--token", default=None,
                    help="the bearer token every service wants (default: a random one, printed when the simulator starts)")
    ss.add_argument("--seed", type=int, default=0, help="draws the scenario's service-time spread")
    sr = ssub.add_parser("replay", help="prime then replay a fixture straight through the cache model")
    sr.add_argument("fixture", help="a fixture name under fixtures/data (c1-52, tok1024)")
    sr.add_argument("--order", choices=["forward", "reverse"], default="forward", help="the replay's order after the prime")
    sr.add_argument("--scenario", default="flare-47581cca", help=f"the simulated host: {scenarios}")


def _add_reading_commands(sub, scenarios: str, sock) -> None:  # noqa: ANN001 - argparse's subparsers action
    """windows and reproduce: a log's windows, and the host-cache model run on them."""
    wn = sub.add_parser("windows", help="list a log's windows: outcome, verdict, restoration and report")
    wn.add_argument("db", nargs="?", type=Path, default=None,
                    help="the event log (default: the daemon's, found through its control socket)")
    wn.add_argument("--json", action="store_true", help="one JSON object per window, a line each")
    sock(wn)

    rp2 = sub.add_parser("reproduce", help="a window's requests (or a trace) through the host-cache model: agreement "
                                           "with what the window observed, and policies side by side",
                         description="reproduce LOG [--window ID] [--scenario S] [--policies P,...]  |  "
                                     "reproduce --trace FILE --capacity-blocks N [--capacity-blocks M ...]. "
                                     "Exit 0: the model reproduces the window's per-request host reuse (log), or the trace ran; "
                                     "1: it does not reproduce it; 2: bad input.")
    rp2.add_argument("log", nargs="?", type=Path, default=None, help="a window's event log (log.db)")
    rp2.add_argument("--window", default=None, help="the window (default: the log's last)")
    rp2.add_argument("--scenario", default="flare-47581cca",
                     help=f"the model's key rules, block size and checkpoint eligibility: {scenarios}")
    rp2.add_argument("--policies", default=None, metavar="P,...",
                     help="eviction policies to run on the same requests: lru_leaf, marconi, protect_full_prompt, "
                          "block_lru (the block-level baseline); default: none for a log, all four for a trace")
    rp2.add_argument("--tolerance", type=ranged("--tolerance"), default=0, metavar="TOKENS",
                     help="a request agrees when predicted and observed host reuse differ by at most this")
    rp2.add_argument("--fit", action="store_true",
                     help="with a log: fit a family of host-cache models (an LRU over records, the seed's pools, "
                          "a block LRU) and their capacity to the window's own requests; the best fit and the "
                          "runners-up, and the policies compared on the fitted model (exit 0: the best fit agrees "
                          "on every request)")
    rp2.add_argument("--trace", type=Path, default=None, metavar="FILE",
                     help="a Mooncake-format trace (JSON lines: input_length, output_length, hash_ids) instead of a log")
    rp2.add_argument("--capacity-blocks", type=ranged("--capacity-blocks"), action="append", default=[], metavar="N",
                     help="with --trace: the page pool in blocks, repeatable (one run per capacity)")
    rp2.add_argument("--capacity-rows", type=ranged("--capacity-rows"), default=None, metavar="R",
                     help="with --trace: the row pool (default: in the scenario's proportion to pages)")
    rp2.add_argument("--limit", type=ranged("--limit"), default=None, metavar="K", help="with --trace: its first K requests only")
    rp2.add_argument("--out", type=Path, default=None, metavar="DIR",
                     help="also write reproduce.json and reproduce.html (a table and charts) into DIR")
    rp2.add_argument("--json", action="store_true", help="one JSON object instead of lines")


def _add_site_commands(sub) -> None:  # noqa: ANN001 - argparse's subparsers action
    """init-site, share and site check: a site's profile, the shipped files, a live site read."""
    ins = sub.add_parser("init-site", help="write an annotated site profile and token-file placeholders (mode 0600)",
                         description="Writes DIR/NAME.toml for an engine KIND, and a placeholder token file (0600) for "
                                     "each service it names; never overwrites a file. docs/site-profile.md describes every key.")
    ins.add_argument("kind", choices=["flare", "vllm", "sglang", "llamacpp"], help="the engine the site serves")
    ins.add_argument("dir", type=Path, help="the folder to write into (created if missing)")
    ins.add_argument("--name", default=None, help="the profile's name, NAME.toml (default: KIND)")
    ins.add_argument("--systemd", action="store_true",
                     help="name the tokens as systemd credentials (credential:NAME.SERVICE.token), write their "
                          "placeholders under --credentials-dir, and DIR/NAME.flare-diagd.conf: the unit's drop-in "
                          "with exactly the LoadCredential= lines this site needs")
    ins.add_argument("--credentials-dir", type=Path, default=Path("/etc/flare-diag/credentials"),
                     help="with --systemd: where the credential files go")
    sh = sub.add_parser("share", help="print where this installation keeps the systemd units, site templates, "
                                      "engine build script and documents")
    sh.add_argument("--json", action="store_true", help="one JSON object instead of lines")

    site = sub.add_parser("site", help="check a live site without changing it")
    sitesub = site.add_subparsers(dest="site_cmd", required=True, parser_class=_Parser)
    sc = sitesub.add_parser("check", help="probe every endpoint a window would use; change nothing",
                            description="Exit 0: everything the plan needs is observable on this site; 1: something it needs is missing; "
                                        "2: bad input.")
    sc.add_argument("site", type=Path, help="the site profile (TOML)")
    sc.add_argument("--plan", type=Path, default=None,
                    help="the plan to check the site for (default: the contract alone, no identity to match)")
    sc.add_argument("--json", action="store_true", help="one JSON object instead of lines")


def _add_plan_commands(sub, scenarios: str) -> None:  # noqa: ANN001 - argparse's subparsers action
    """plan check, follow-on and forecast."""
    plan = sub.add_parser("plan", help="check a plan")
    psub = plan.add_subparsers(dest="plan_cmd", required=True, parser_class=_Parser)
    pc = psub.add_parser("check", help="decode and check a plan; name the first bad field")
    pc.add_argument("plan", type=Path, help="the plan (TOML)")
    pc.add_argument("--json", action="store_true", help="one JSON object instead of a line")
    pc.add_argument("--site", type=Path, default=None,
                    help="the site profile a `run` would name, read as `run` reads it: fixtures beside it are searched "
                         "too, and the bodies are held to what its engine needs (usage asked for)")
    fo = psub.add_parser("follow-on", help="the second window's plan, from a window that earns it",
                         description="From a row_checkpoint_churn window the reproducer reproduces, with a policy that "
                                     "reuses more in the model (--policy), or from a window whose cache effects and trace "
                                     "overhead are understood (--stage nsight). Exit 0: written; 2: refused (the gate "
                                     "named) or bad input. docs/follow-on.md.")
    fo.add_argument("source", type=Path, help="the source window's log.db, its out folder, or a report.json beside it")
    fo.add_argument("--window", default=None, help="the source window (default: the log's last)")
    fo.add_argument("--policy", default=None, help="the candidate eviction policy (lru_leaf, marconi, protect_full_prompt)")
    fo.add_argument("--stage", choices=["policy", "nsight"], default="policy",
                    help="policy: a policy window (default); nsight: admit the capture stage")
    fo.add_argument("--repeats", type=ranged("--repeats"), default=3, help="matched repeats a side, interleaved ABBA (default 3)")
    fo.add_argument("--scenario", default="flare-47581cca", help="the reproducer's model of the host (as `reproduce`)")
    fo.add_argument("--force", action="store_true", help="write the plan despite a gate it fails, recording which "
                                                           "(never without the follow-on's recorded review, nor from a "
                                                           "window whose restoration did not verify)")
    fo.add_argument("--reviews", type=Path, default=None, metavar="LOG",
                    help="the log holding the follow-on's review (`flare-diag review sign WINDOW --policy P --by NAME "
                         "--log LOG`); default: the source log")
    fo.add_argument("--out", type=Path, required=True, help="where to write the plan (TOML); never overwritten")
    pf = psub.add_parser("forecast", help="the schedule a window would follow, and whether its required cells fit",
                         description="Exit 0: every required cell fits before the stop minute; 1: some do not; 2: bad input.")
    pf.add_argument("plan", type=Path, help="the plan (TOML)")
    pf.add_argument("--site", type=Path, default=None, help="the site profile (its folder is searched for fixtures)")
    pf.add_argument("--calibrate", type=Path, default=None, metavar="LOG",
                    help="start from what an earlier window's log measured instead of the plan's rates alone")
    pf.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    pf.add_argument("--simulate", type=int, default=None, metavar="N",
                    help="run N seeded model windows against flaresim in virtual time and print how often every "
                         "required cell is measured, each phase's end minute and how often the restore fits "
                         "(exit 0 only when every run measured every required cell and restored in time)")
    pf.add_argument("--seed", type=int, default=0, help="with --simulate: the first seed (runs use SEED..SEED+N-1)")
    pf.add_argument("--scenario", default="flare-47581cca", help=f"with --simulate: the simulated host: {scenarios}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, just that command's parser (`only_found` says if it is one)."""
    scenarios, FAULT_KINDS = "", cast(tuple[str, ...], ())
    if only is None or only in _SCENARIO_COMMANDS:
        from flare_diag.daemon.simulator import FAULT_KINDS, list_scenarios  # the simulator's own lists: named in help, checked by it
        scenarios = f"one of {', '.join(list_scenarios())}, or a scenario TOML file"
    p = _Parser(prog="flare-diag", description=__doc__, epilog=EXIT_CODES)
    p.add_argument("--version", action=_Version, nargs=0, help="show the program's version number and exit")
    sub: Any = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)  # or _Only, duck-typed
    if only is not None:
        sub = _Only(sub, only)

    comp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                          description="Print a completion script for flare-diag. Install it with, for bash: "
                                      "flare-diag completion bash > ~/.local/share/bash-completion/completions/flare-diag")
    comp.add_argument("shell", choices=["bash", "zsh"], help="the shell to write it for")
    _add_log_commands(sub)

    rh = _add_rehearse(sub, scenarios, FAULT_KINDS)
    rn = _add_run(sub)
    for sp in (rh, rn):
        _forecast_flags(sp)
        sp.add_argument("--json", action="store_true",
                        help="JSON lines on stdout: every event as it is logged, then one result line (outcome, "
                             "verdict, report paths, exit code); what people read goes to stderr")

    sock = _add_service_commands(sub)
    _add_sim_commands(sub, scenarios)
    _add_reading_commands(sub, scenarios, sock)
    _add_site_commands(sub)
    _add_plan_commands(sub, scenarios)
    if only in (None, "fleet"):
        from flare_diag.daemon.cli.fleet_commands import add_parser as add_fleet
        add_fleet(sub, _Parser)
    if only in (None, "review"):
        from flare_diag.daemon.cli.review_commands import add_parser as add_review
        add_review(sub, _Parser)
    p.only_found = only is None or sub.found  # type: ignore[attr-defined,union-attr]  # read by main
    return p


class _Version(argparse.Action):
    """--version, read from the installed metadata only when asked (importlib.metadata is a sixth of a call)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"flare-diag {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("flare-diag")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _forecast_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--calibrate", type=Path, default=None, metavar="LOG",
                    help="estimate from what an earlier window's log measured (tokens per body, pace, load time)")
    sp.add_argument("--accept-partial", action="store_true",
                    help="run even when the forecast says a required cell does not fit (the window ends partial)")


def load_plan(path: Path) -> tuple[bytes, Plan]:
    """The plan file's bytes and the checked plan, or UsageError naming it."""
    from flare_diag.daemon.window.setup import InputError, read_plan
    try:
        return read_plan(path)
    except InputError as exc:
        raise UsageError(str(exc)) from None


def _calibration(path: Path | None):
    if path is None:  # before the imports: the forecast's (httpx, the host API) are most of a `start`'s own
        return None
    from flare_diag.daemon.window.forecast import load_calibration
    from flare_diag.daemon.window.setup import InputError
    try:
        return load_calibration(path)
    except InputError as exc:
        raise UsageError(str(exc)) from None


def _plan_follow_on(args: argparse.Namespace) -> int:
    from flare_diag.daemon.reproducer.followon import Refused, follow_on, source_log, write_consistency_fixture, write_plan
    from flare_diag.daemon.simulator import ScenarioError, load_scenario
    if args.out.exists():
        raise UsageError(f"--out {args.out}: already exists; a plan is never overwritten")
    try:
        sc = load_scenario(args.scenario)
        db = source_log(args.source)
        plan = follow_on(db, args.window, sc, args.policy, args.stage, args.repeats, args.force, args.reviews)
        greedy = write_consistency_fixture(plan, db, args.out)
    except (Refused, ScenarioError) as exc:
        raise UsageError(str(exc)) from None
    sha = write_plan(plan, args.out)
    fo = plan.follow_on
    print(f"{args.out}: {plan.name} (sha256 {sha[:16]})" + (f"; FORCED past: {fo.override}" if fo and fo.forced else ""))
    if greedy is not None:
        print(f"{greedy}: its output-consistency fixture (greedy bodies); keep it beside the plan, or in the daemon's "
              f"sites directory for `flare-diag start`")
    if fo and fo.stage == "policy":
        print(f"run {len(fo.order)} windows in this order ({', '.join(fo.order)}), then `flare-diag report compare LOG "
              f"--windows <candidate ids> --baseline <baseline ids> --repeats {fo.repeats}`")
    return EXIT_OK


def _plan_forecast(args: argparse.Namespace) -> int:
    import json

    import msgspec

    from flare_diag.daemon.window.forecast import schedule
    from flare_diag.daemon.window.setup import InputError, WindowSetup, load_fixtures, setup_for_site
    plan_raw, plan = load_plan(args.plan)
    cal = _calibration(args.calibrate)
    try:
        if args.site is not None:
            setup = setup_for_site(args.plan, args.site)
        else:
            setup = WindowSetup(plan_raw, plan, None, load_fixtures(plan, [args.plan.parent.resolve()]))  # type: ignore[arg-type]  # a forecast without --site reads the plan and its fixtures only
    except InputError as exc:
        raise UsageError(str(exc)) from None
    if args.simulate is not None:
        return _plan_simulate(args, setup, cal)
    sched = schedule(setup, cal)
    print(json.dumps(msgspec.to_builtins(sched)) if args.json else "\n".join(sched.render()))
    return EXIT_OK if sched.fits and not sched.stall_error() else EXIT_FAILED


def _plan_simulate(args: argparse.Namespace, setup, cal) -> int:
    import msgspec

    from flare_diag.daemon.rehearsal.simulate import MAX_RUNS, simulate
    from flare_diag.daemon.simulator import ScenarioError, load_scenario
    if not 1 <= args.simulate <= MAX_RUNS:
        raise UsageError(f"--simulate {args.simulate}: expected a number of runs from 1 to {MAX_RUNS}")
    if not 0 <= args.seed < 2**63 - MAX_RUNS:
        raise UsageError(f"--seed {args.seed}: expected a whole number from 0 to 2^63-{MAX_RUNS + 1}")
    if args.site is not None:
        raise UsageError("--simulate: expected no --site (a simulation runs against flaresim; --scenario picks its host)")
    try:
        load_scenario(args.scenario)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    sim = simulate(setup.plan_raw, setup.plan, args.scenario, setup.fixtures, args.simulate, args.seed, cal)
    print(msgspec.json.encode(sim).decode() if args.json else "\n".join(sim.render()))
    return EXIT_OK if sim.every_required_measured == 1 and sim.restore_within_reservation == 1 else EXIT_FAILED


def _windows(args: argparse.Namespace) -> int:
    import json
    import time

    from flare_diag.daemon.cli.windows_list import list_windows
    db = args.db
    if db is None:  # the daemon's own log: where its status says it is
        from flare_diag.daemon.cli import client
        from flare_diag.daemon.service import control
        try:
            c = client.Connection(client.socket_path(args.socket))
            try:
                db = Path(c.call(control.Status())["log"]["path"])
            finally:
                c.close()
        except client.DaemonUnreachable as exc:
            print(f"flare-diag: error: windows: no DB given and the daemon is not reachable ({exc})", file=sys.stderr)
            return EXIT_UNREACHABLE
        except client.Refused as exc:
            raise UsageError(f"windows: no DB given and the daemon could not be asked for its log ({exc})") from None
    if db.is_dir() and (db / "log.db").is_file():
        db = db / "log.db"
    if not db.is_file():
        raise UsageError(f"windows {db}: no such log file")
    try:
        rows = list_windows(db)
    except PermissionError:
        raise UsageError(f"windows {db}: not readable by this user (ask for read access to the state folder, "
                         "or run `flare-diag report WINDOW_ID` through the daemon)") from None
    damaged = integrity_warning(db)
    for r in rows:
        if args.json:
            print(json.dumps(r))
            continue
        opened = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r["opened_wall_ns"] // 10**9)) if r["opened_wall_ns"] else "—"
        restored = {True: "restoration verified", False: "restoration NOT verified", None: "no restoration recorded"}[r["restoration_verified"]]
        print(f"{r['window_id']}  {opened}  {r['outcome'] or 'OPEN'}  verdict {r['verdict'] or '—'}  {restored}  "
              f"report {r['report'] or '—'}")
    if not rows and not args.json:
        print(f"{db}: no window")
    return EXIT_FAILED if damaged else EXIT_OK


def _reproduce(args: argparse.Namespace) -> int:
    import msgspec

    from flare_diag.daemon.reproducer.reproduce import (
        BASELINE, POLICIES, ReproduceError, parse_policies, render_html, render_trace, render_trace_html, render_window,
        reproduce_trace, reproduce_window,
    )
    from flare_diag.events.sqlschema import NotAnEventLog
    from flare_diag.daemon.simulator import ScenarioError, TraceError, load_scenario
    if (args.log is None) == (args.trace is None):
        raise UsageError("reproduce: expected a log (LOG) or --trace FILE, one of them")
    try:
        sc = load_scenario(args.scenario)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    try:
        if args.trace is not None:
            if not args.capacity_blocks:
                raise UsageError("reproduce --trace: expected --capacity-blocks N (a positive number of blocks), once or more")
            if not args.trace.is_file():
                raise UsageError(f"--trace {args.trace}: no such file")
            trep = reproduce_trace(args.trace, args.capacity_blocks, sc, parse_policies(args.policies, [*POLICIES, BASELINE]),
                                   args.capacity_rows, args.limit)
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "reproduce.json").write_bytes(msgspec.json.encode(trep) + b"\n")
                (args.out / "reproduce.html").write_text(render_trace_html(trep))
            print(msgspec.json.encode(trep).decode() if args.json else "\n".join(render_trace(trep)))
            return EXIT_OK
        if args.capacity_blocks or args.capacity_rows or args.limit:
            raise UsageError("reproduce LOG: --capacity-blocks, --capacity-rows and --limit go with --trace")
        if args.log.is_dir() and (args.log / "log.db").is_file():  # an out folder: the log it holds
            args.log = args.log / "log.db"
        if not args.log.is_file():
            raise UsageError(f"{args.log}: no such log file")
        damaged = integrity_warning(args.log)
        if args.fit:
            from flare_diag.daemon.reproducer.fit import fit_window, render_fit
            fitted = fit_window(args.log, args.window, sc, args.tolerance)
            print(msgspec.json.encode(fitted).decode() if args.json else "\n".join(render_fit(fitted)))
            return EXIT_OK if fitted.best.agreed == fitted.best.compared and fitted.best.compared and not damaged \
                else EXIT_FAILED
        try:
            rep = reproduce_window(args.log, args.window, sc, parse_policies(args.policies, []), args.tolerance)
        except ReproduceError as exc:
            if not damaged:
                raise
            # a damaged log is the finding (said above): the failed verification's exit, not bad input's
            print(f"flare-diag: error: {one_line(exc)}", file=sys.stderr)
            return EXIT_FAILED
    except (ReproduceError, TraceError, NotAnEventLog) as exc:
        raise UsageError(str(exc)) from None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "reproduce.json").write_bytes(msgspec.json.encode(rep) + b"\n")
        (args.out / "reproduce.html").write_text(render_html(rep))
    print(msgspec.json.encode({**msgspec.to_builtins(rep), "reproduces": rep.reproduces}).decode() if args.json
          else "\n".join(render_window(rep)))
    return EXIT_OK if rep.reproduces and not damaged else EXIT_FAILED


def _init_site(args: argparse.Namespace) -> int:
    from flare_diag.daemon.cli.initsite import init_site
    from flare_diag.daemon.window.setup import InputError
    try:
        profile, written, kept = init_site(args.kind, args.dir, args.name, args.systemd, args.credentials_dir)
    except InputError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {profile}: edit every REPLACE value and the URLs (docs/site-profile.md describes each key)")
    for p in written:
        if p.suffix == ".conf":
            print(f"wrote {p}: install it as /etc/systemd/system/flare-diagd.service.d/site-{profile.stem}.conf, "
                  f"then `systemctl daemon-reload`")
        else:
            print(f"wrote {p} (mode 0600): replace its placeholder with the service's token")
    for p in kept:
        print(f"kept {p}: it already exists")
    check = f"flare-diag site check {profile} --plan PLAN"
    if args.systemd:
        check = f"CREDENTIALS_DIRECTORY={args.credentials_dir} {check}  (as the unit will hand them over)"
    print(f"then: {check}")
    return EXIT_OK


def _share(args: argparse.Namespace) -> int:
    from flare_diag.daemon.cli.initsite import shared_files
    files = shared_files()
    if args.json:
        import json
        print(json.dumps(files))
    else:
        for k, v in files.items():
            print(f"{k}: {v}")
    return EXIT_OK


def _bodies_fit_the_sites_engine(path: Path, site: Path, fixtures: dict) -> None:
    """The fixture checks `run` makes against the site's engine that need no host: every body asks for the
    usage an engine that streams it only when asked must be asked for (site check's serving.usage)."""
    from flare_diag.daemon.hosts.profile_rules import usage_unasked, usage_unasked_words
    from flare_diag.daemon.hosts.site import SiteError, load_site
    try:
        profile = load_site(site).profile
    except SiteError as exc:
        raise UsageError(f"--site {site}: {exc}") from None
    unasked = usage_unasked(profile, fixtures)
    if unasked is not None:
        raise UsageError(f"plan check {path}: {usage_unasked_words(unasked)} (site check: serving.usage)")


def _plan_check(path: Path, as_json: bool = False, site: Path | None = None) -> int:
    """The plan decoded and checked, and its fixtures checked as `rehearse` and `run` check them (found beside
    the plan, beside the site profile when given, then built in; each body against the plan's sampling)."""
    _raw, plan = load_plan(path)
    from flare_diag.daemon.window.setup import InputError, load_fixtures
    from flare_diag.policies.planner import all_phases
    if site is not None and not site.is_file():
        raise UsageError(f"--site {site}: no such site profile; expected the site.toml a `run` would name")
    try:
        fixtures = load_fixtures(plan, [path.parent.resolve(), *([site.parent.resolve()] if site else [])])
    except InputError as exc:
        raise UsageError(f"plan check {path}: {exc}") from None
    if site is not None:
        _bodies_fit_the_sites_engine(path, site, fixtures)
    phases = all_phases(plan)
    sizes = {name: len(f.bodies) for name, f in fixtures.items()}
    if as_json:
        import json
        print(json.dumps({"ok": True, "plan": plan.name, "method": plan.method, "phases": [p.id for p in phases],
                          "stop_min": plan.timing.stop_min, "window_min": plan.timing.window_min, "fixtures": sizes}))
    else:
        checked = ", ".join(f"{n} ({k} bodies)" for n, k in sizes.items()) or "none"
        print(f"ok: {plan.name}: method {plan.method}, {len(phases)} phases, stop at minute {plan.timing.stop_min:g} of "
              f"{plan.timing.window_min:g}; fixtures with the plan's sampling: {checked}")
    return EXIT_OK




def _out_dir(out: Path | None) -> Path:
    import time
    out = out or Path("out") / time.strftime("rehearsal-%Y%m%dT%H%M%SZ", time.gmtime())
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a folder; expected a new folder (or an empty one) for the log and reports")
    if any(p.exists() and not p.is_dir() for p in out.parents):
        raise UsageError(f"--out {out}: a part of the path is a file; expected a folder that can be made")
    if (out / "log.db").exists():
        raise UsageError(f"{out}: already holds a window's log; choose a new --out")
    return out


def _need_simulator(cmd: str) -> None:
    """`rehearse` and `sim serve` serve flaresim, whose HTTP stack is the `sim` extra."""
    import importlib.util
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"{cmd}: the simulator needs {' and '.join(missing)}, which this install lacks; "
                         "install the sim extra: pip install 'flare-diag[sim]'")


def _scale_or_auto(text: str) -> float | str:
    """--time-scale's value: a factor, or 'auto' (rehearse chooses one, and says which)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a factor (window seconds a wall second) or 'auto', got {text!r}") from None


def _auto_scale(plan_raw: bytes, plan, args: argparse.Namespace, console) -> float:  # noqa: ANN001 - the CLI's own
    """rehearse --time-scale auto: the scale chosen by a probe of the simulated incumbent, said on the console."""
    import asyncio

    from flare_diag.daemon.rehearsal.autoscale import auto_time_scale
    scale, said = asyncio.run(auto_time_scale(plan_raw, plan, args.scenario, args.seed, args.candidate, str(args.plan),
                                              _calibration(args.calibrate)))
    console.print(said)
    return scale


def _window(args: argparse.Namespace) -> int:
    from flare_diag.daemon.cli.foreground import rehearse, resume_window, run_window
    from flare_diag.daemon.rehearsal.rehearse import fault_phase_error, parse_fault
    from flare_diag.daemon.window.setup import InputError, setup_for_site
    if args.cmd == "run":
        if args.resume is not None:
            if args.plan or args.site or args.out:
                raise UsageError("--resume OUT: expected no --plan, --site or --out (the window's own are recorded)")
            return _resume(args.resume, resume_window, args.json)
        missing = [f"--{n}" for n in ("plan", "site", "out") if getattr(args, n) is None]
        if missing:
            raise UsageError(f"run: expected {', '.join(missing)} (or --resume OUT)")
    plan_raw, plan = load_plan(args.plan)
    from flare_diag.policies.scaling import time_scale_error
    if args.time_scale is not None and args.time_scale != "auto" and (bad := time_scale_error(plan, args.time_scale)):
        raise UsageError(f"--{bad.replace('_', '-', 1)}")
    if args.cmd == "rehearse":
        from flare_diag.daemon.simulator import RECIPES
        if args.candidate not in RECIPES or args.candidate == "glm-incumbent":
            raise UsageError(f"--candidate {args.candidate}: expected one of the simulated host's candidate recipes "
                             f"({', '.join(r for r in RECIPES if r != 'glm-incumbent')})")
    out = _out_dir(args.out)
    console = make_console(stderr=args.json, guarded=True)
    events_out = _guarded_stdout() if args.json else None
    try:
        if args.cmd == "rehearse":
            _need_simulator("rehearse")
            from flare_diag.daemon.simulator import ScenarioError, load_scenario
            try:
                load_scenario(args.scenario)
            except ScenarioError as exc:
                raise UsageError(str(exc)) from None
            faults = [parse_fault(f) for f in args.fault]  # every input checked before the simulator starts
            if args.time_scale == "auto":
                args.time_scale = _auto_scale(plan_raw, plan, args, console)
            from flare_diag.policies.planner import all_phases
            if bad := fault_phase_error(faults, [p.id for p in all_phases(plan)]):
                raise UsageError(bad)
            if not 0 <= args.seed < 2**63:
                raise UsageError(f"--seed {args.seed}: expected a whole number from 0 to 2^63-1")
            report = rehearse(plan_raw, plan, args.scenario, faults, out, args.time_scale, console,
                              _calibration(args.calibrate), args.accept_partial, str(args.plan), args.seed, events_out,
                              args.candidate)
        else:
            import asyncio
            setup = setup_for_site(args.plan, args.site, args.time_scale, args.reviews)
            setup.calibration = _calibration(args.calibrate)
            if args.calibrate is not None:  # the site's earlier window: the harness rehearses its fitted model too
                setup.earlier = (args.calibrate, None)
            setup.accept_partial = args.accept_partial
            report = asyncio.run(run_window(setup, out, console, events_out=events_out))
    except InputError as exc:
        raise UsageError(str(exc)) from None
    except BaseExceptionGroup as group:  # refused inside the in-process simulator's task group
        refused = _first_input_error(group)
        if refused is None:
            raise
        raise UsageError(str(refused)) from None
    return _reported(report, out, console, args.json)


def _first_input_error(group: BaseExceptionGroup) -> BaseException | None:
    """The refusal a task group wrapped (a rehearsal's forecast or fixture check), if that is what ended it."""
    from flare_diag.daemon.window.setup import InputError
    found, rest = group.split(InputError)
    if found is None or rest is not None:
        return None
    only: BaseException = found
    while isinstance(only, BaseExceptionGroup):
        only = only.exceptions[0]
    return only


def _guarded_stdout():
    from flare_diag.daemon.cli.display import GuardedStream
    return GuardedStream(sys.stdout)


def _resume(out: Path, resume_window, as_json: bool = False) -> int:
    import asyncio

    from flare_diag.daemon.window.setup import InputError
    console = make_console(stderr=as_json, guarded=True)
    try:
        report = asyncio.run(resume_window(out, console, _guarded_stdout() if as_json else None))
    except InputError as exc:
        raise UsageError(str(exc)) from None
    return _reported(report, out, console, as_json)


def _reported(report: dict, out: Path, console, as_json: bool = False) -> int:
    from flare_diag.daemon.reports.report_view import audit_words
    it = report.get("integrity") or {"chain_ok": False, "audit_ok": False}
    out = Path(report.get("published_in") or out)  # elsewhere when the window's own folder stopped taking writes
    console.print(f"reports: {out}/report.json, report.md, report.html; log {out}/log.db "
                  f"(chain {'ok' if it['chain_ok'] else 'BROKEN'}, audit {audit_words(it)})")
    from flare_diag.daemon.cli.client import exit_for
    code = exit_for(report.get("outcome"))
    if code == EXIT_OK and not (it["chain_ok"] and it["audit_ok"]):
        code = EXIT_FAILED
    out_stream = sys.stdout
    if as_json:
        import json
        out_stream = _guarded_stdout()
        out_stream.write(json.dumps({"type": "result", "window_id": report["window_id"], "outcome": report.get("outcome"),
                                     "verdict": (report.get("verdict") or {}).get("hypothesis"),
                                     "restoration_verified": (report.get("restoration") or {}).get("verified"),
                                     "chain_ok": it["chain_ok"], "audit_ok": it["audit_ok"], "log": str(out / "log.db"),
                                     "reports": {f: str(out / f"report.{f}") for f in ("json", "md", "html")},
                                     "exit_code": code}) + "\n")
        out_stream.flush()
    lost = [e for s in (getattr(console, "file", None), out_stream) if (e := getattr(s, "lost", None)) is not None]
    if lost:
        # the window was not stopped by its display; the operator learns that the output was cut, on
        # whatever stream still takes a line
        code = max(code, EXIT_FAILED)
        line = (f"flare-diag: the output stream closed during the window ({lost[0].__class__.__name__}); the window "
                f"went on and closed {report.get('outcome')}; reports in {out}\n")
        for stream in (sys.stderr, sys.stdout):
            try:
                stream.write(line)
                stream.flush()
                break
            except (OSError, ValueError):
                continue
    return code


def _site_check(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from flare_diag.daemon.hosts.site import SiteError, load_site
    from flare_diag.daemon.window.sitecheck import check_site, render
    from flare_diag.daemon.hosts.target import Target
    plan = load_plan(args.plan)[1] if args.plan is not None else None
    try:
        site = load_site(args.site)
    except SiteError as exc:
        raise UsageError(str(exc)) from None
    fixtures = {}
    if plan is not None:  # found where `run` finds them: beside the plan, beside the site profile, built in
        from flare_diag.daemon.window.setup import InputError, load_fixtures
        try:
            fixtures = load_fixtures(plan, [args.plan.parent.resolve(), args.site.parent.resolve()])
        except InputError as exc:
            raise UsageError(str(exc)) from None

    async def probe():
        target = Target(site, fixtures, "")
        try:
            return await check_site(target, plan)
        finally:
            await target.close()

    check = asyncio.run(probe())
    from flare_diag.daemon.hosts.site import scrub
    text = scrub(json.dumps(check.as_dict()) if args.json else render(check), site.tokens.values())
    if args.json or not sys.stdout.isatty():
        print(text)
    else:  # on a terminal, what stops a window is red and readiness green (Text: a reason's brackets stay text)
        from rich.text import Text
        out = make_console()
        for line in text.splitlines():
            bad = line.startswith(("site check: NOT READY", "SERVICE DOWN")) or line.endswith("<- required")
            out.print(Text(line, style="bold red" if bad else "green" if line.startswith("site check: ready") else ""))
    return EXIT_OK if check.ready else EXIT_FAILED


def _sim(args: argparse.Namespace) -> int:
    # The simulator is a fixture: the CLI starts it, the daemon never imports it for its own work.
    from flare_diag.daemon.simulator import ScenarioError, load_scenario
    try:
        load_scenario(args.scenario)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    if args.sim_cmd == "serve":
        if not 0 <= args.port <= 65535:
            raise UsageError(f"--port {args.port}: expected 0 to 65535 (0: any free one)")
        if not (math.isfinite(args.time_scale) and 0 < args.time_scale <= 1e6):
            raise UsageError(f"--time-scale {args.time_scale}: expected a finite factor above 0, at most 1e6")
        _need_simulator("sim serve")
        from flare_diag.daemon.simulator import serve
        import secrets
        token = args.token
        if token is None:  # made here, and printed: a client needs it
            token = secrets.token_hex(16)
            print(f"flaresim bearer token: {token}", flush=True)
        return serve(["--port", str(args.port), "--scenario", args.scenario, "--time-scale", str(args.time_scale),
                      "--seed", str(args.seed), "--token", token])
    from flare_diag.daemon.simulator import replay
    try:
        replay(args.fixture, args.order, args.scenario)
    except FileNotFoundError as exc:
        raise UsageError(f"{args.fixture}: no such fixture ({exc.filename})") from None
    return EXIT_OK


def _client(args: argparse.Namespace) -> int:
    from flare_diag.daemon.cli import client
    path = client.socket_path(args.socket)
    try:
        if args.cmd == "status":
            return client.status(path, args.json)
        console = make_console(stderr=True)
        if args.cmd == "start":
            import msgspec
            plan_raw, plan = load_plan(args.plan)  # read here, with the caller's rights, and checked
            from flare_diag.policies.scaling import time_scale_error
            if bad := time_scale_error(plan, args.time_scale):
                raise UsageError(f"--{bad.replace('_', '-', 1)}")
            cal = _calibration(args.calibrate)
            # fixtures beside the plan are the caller's: named to the daemon so that a refusal can say
            # where they are and why it cannot read them, never opened by it
            beside = {f.name: str((args.plan.parent / f.name).resolve()) for f in plan.fixtures
                      if (args.plan.parent / f.name / "manifest.json").is_file()}
            return client.start(path, plan_raw, str(args.plan), args.site, args.time_scale, console,
                                calibration=msgspec.to_builtins(cal) if cal else None, accept_partial=args.accept_partial,
                                caller_fixtures=beside)
        if args.cmd == "abort":
            return client.abort(path, args.reason, console)
        if args.cmd == "watch":
            # with --json, stdout is JSON lines alone: the human words (no window running) go to stderr
            return client.watch(path, args.from_seq, make_console(stderr=args.json), sys.stdout if args.json else None)
        return client.report(path, args.target, args.format, args.out)
    except client.DaemonUnreachable as exc:
        print(f"flare-diag: error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except client.Refused as exc:
        if exc.code == "busy":  # not bad input: the same command works once the running window closes
            print(f"flare-diag: busy: the daemon refused {args.cmd}: {one_line(exc)}", file=sys.stderr)
            return EXIT_BUSY
        raise UsageError(f"the daemon refused {args.cmd}: {exc}") from None


def _report(args: argparse.Namespace) -> int:
    """Offline when given a log file (or `compare`), else the daemon's report of a window id."""
    if args.target == "compare":
        return _compare(args)
    path = Path(args.target)
    if path.is_dir() and (path / "log.db").is_file():  # an out folder: the log it holds
        path = path / "log.db"
    if not path.is_file():
        if args.target.endswith((".db", ".sqlite")) or "/" in args.target or path.is_dir():
            raise UsageError(f"{args.target}: no such log file")
        return _client(args)
    from flare_diag.daemon.reports.publish import publish_snapshot, render_chunks, spooled_report
    from flare_diag.events.reader import LogReader
    from flare_diag.events.sqlschema import NotAnEventLog
    try:
        with LogReader(path) as r:
            windows = r.window_ids()
    except NotAnEventLog as exc:
        raise UsageError(str(exc)) from None
    if not windows:
        raise UsageError(f"{path}: the log holds no window")
    window = args.window or windows[-1]
    if window not in windows:
        raise UsageError(f"--window {window}: not in {path} (it has {', '.join(windows)})")
    from flare_diag.events.base import BadEventError, UnknownEventError
    try:  # one read of the log, the request rows spooled: a long window's report is never held whole
        with spooled_report(path, window) as report:
            if args.out is not None:
                print(publish_snapshot(report, args.out))
            else:
                sys.stdout.buffer.writelines(render_chunks(report, args.format))
    except BadEventError as exc:
        print(f"flare-diag: {path}: the log does not verify: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except UnknownEventError as exc:
        raise UsageError(f"{path}: {exc}") from None
    from flare_diag.daemon.reports.report_view import integrity_problem
    it = report["integrity"]
    problem = integrity_problem(it)
    if problem:  # a report of a log that does not verify is no evidence
        print(f"flare-diag: {path}: the log does not verify: {problem}", file=sys.stderr)
        return EXIT_FAILED
    if not it["audit_ok"]:  # written, and it says so at its top: the decisions stand as recorded, unconfirmed
        print(f"flare-diag: {path}: decisions not audited by this build: {it.get('audit_policy')}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _compare(args: argparse.Namespace) -> int:
    from flare_diag.daemon.reports.compare import CompareError, compare, noise_line
    if args.db is not None and not args.db.is_file():
        raise UsageError(f"report compare: expected the log file after 'compare' (got {args.db})")
    if not args.windows or not args.baseline:
        raise UsageError("report compare: expected --windows A B C and --baseline X")
    try:
        verdict, runs, stats = compare(args.db, args.windows, args.baseline, args.repeats)
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    candidates = set(list(runs)[:len(args.windows)])
    if args.json:
        import json
        import msgspec
        print(json.dumps({"accepted": verdict.accepted, "reason": verdict.reason,
                          "primary_benefit": verdict.primary_benefit, "worst_regression": verdict.worst_regression,
                          "bar": {"min_benefit": verdict.min_benefit, "max_regression": verdict.max_regression}, "runs": {
            w: {"role": "candidate" if w in candidates else "baseline", "correct": run.correct,
                "incorrect": run.incorrect, "median_ttft_ms": run.primary, "protected": run.protected}
            for w, run in runs.items()},
            "statistics": {s.metric: msgspec.to_builtins(s) for s in stats}}))
        return EXIT_OK if verdict.accepted else EXIT_FAILED
    for w, run in runs.items():
        role = "candidate" if w in candidates else "baseline"
        prot = ", ".join(f"{k} {v:.1f}" for k, v in run.protected.items())
        print(f"{role:9} {w}: correct {'yes' if run.correct else 'no (' + run.incorrect + ')'}, median TTFT "
              f"{run.primary:.1f} ms, {prot}")
    for s in stats:
        print(noise_line(s, verdict.min_benefit))
    print(verdict.reason)
    return EXIT_OK if verdict.accepted else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the command named first: only its parser is built (a command's start-up is mostly this and imports)
    parser = build_parser(only=argv[0]) if argv and not argv[0].startswith("-") else build_parser()
    if not parser.only_found:  # type: ignore[attr-defined]  # not a command: the whole parser says so
        parser = build_parser()
    if not argv:  # a user finding their way: the whole help, and the exit of a usage error
        parser.print_help()
        return EXIT_BAD_INPUT
    bad = next((a for a in argv if "\0" in a), None)
    if bad is not None:  # no shell passes one (argv is NUL-terminated); a caller in-process can
        print(f"flare-diag: error: {bad[:80]!r}: an argument holds a NUL byte", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        with _signals_interrupt():
            return _main(parser.parse_args(argv))
    except BrokenPipeError:
        # the reader went away (`log export | head -1`): what it wanted it has; no traceback, and no
        # second error when the interpreter flushes stdout on the way out
        import os
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


_RECEIVED: list[int] = []  # the signals _signals_interrupt turned into SIGINT, last one last


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP interrupt a command the way SIGINT does (asyncio's runner cancels its task
    and raises KeyboardInterrupt cleanly), until a window installs its own handlers (an abort that
    restores); the earlier handlers are put back after."""
    def on(signum: int, _frame: object) -> None:
        _RECEIVED.append(signum)
        signal.raise_signal(signal.SIGINT)
    saved = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            saved[sig] = signal.signal(sig, on)
    except ValueError:  # not the main thread (an embedding caller): leave its handlers alone
        pass
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def _interrupted(args: argparse.Namespace) -> int:
    """One line, and 128 + the signal's number, as a shell reports a command a signal ended."""
    signum = _RECEIVED[-1] if _RECEIVED else signal.SIGINT
    where = (" before the window opened: nothing on the host was changed" if args.cmd in ("run", "rehearse")
             else "")
    print(f"flare-diag: interrupted by {signal.Signals(signum).name}{where}", file=sys.stderr)
    return 128 + signum


def _not_a_log() -> tuple[type[Exception], ...]:
    from flare_diag.events.sqlschema import NotAnEventLog
    return (NotAnEventLog,)


def _damaged_log() -> tuple[type[BaseException], ...]:
    import sqlite3

    from flare_diag.events.base import BadEventError, UnknownEventError
    return (sqlite3.DatabaseError, UnicodeDecodeError, BadEventError, UnknownEventError)


def _main(args: argparse.Namespace) -> int:
    # the log's error types are imported only when an error is being matched (an except clause's types are
    # evaluated then): a command that never opens a log never loads the event schema
    try:
        return _dispatch(args)
    except UsageError as exc:
        print(f"flare-diag: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return _interrupted(args)
    except _not_a_log() as exc:  # a file that is not a flare-diag log at all: the caller's input
        print(f"flare-diag: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except _damaged_log() as exc:
        # a log the tools cannot read to the end: damaged or forged, and said so in one line
        target = getattr(args, "db", None) or getattr(args, "target", "the log")
        print(f"flare-diag: {target}: the log is damaged and does not verify ({type(exc).__name__}: {one_line(exc)})",
              file=sys.stderr)
        return EXIT_FAILED


def _dispatch(args: argparse.Namespace) -> int:
    """The command's exit code; its errors are `_main`'s to say."""
    whole: dict[str, Callable[[argparse.Namespace], int]] = {  # commands that are one function of this module
        "report": _report, "rehearse": _window, "run": _window, "sim": _sim, "site": _site_check,
        "windows": _windows, "reproduce": _reproduce, "init-site": _init_site, "share": _share}
    if args.cmd in whole:
        return whole[args.cmd](args)
    if args.cmd == "completion":
        from flare_diag.daemon.cli import completion
        print(getattr(completion, args.shell)(build_parser()), end="")
        return EXIT_OK
    if args.cmd in ("status", "start", "abort", "watch"):
        return _client(args)
    if args.cmd == "log":
        from flare_diag.daemon.cli.log_commands import run_log
        return run_log(args)
    if args.cmd == "fleet":
        from flare_diag.daemon.cli.fleet_commands import run_fleet
        return run_fleet(args)
    if args.cmd == "review":
        return _review(args)
    if args.cmd == "plan":
        if args.plan_cmd == "follow-on":
            return _plan_follow_on(args)
        return _plan_forecast(args) if args.plan_cmd == "forecast" else _plan_check(args.plan, args.json, args.site)
    return EXIT_BAD_INPUT


def _review(args: argparse.Namespace) -> int:
    from flare_diag.daemon.cli import client
    from flare_diag.daemon.cli.review_commands import run_review
    try:
        return run_review(args)
    except client.DaemonUnreachable as exc:
        print(f"flare-diag: error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except client.Refused as exc:
        raise UsageError(f"the daemon refused the review: {exc}") from None

