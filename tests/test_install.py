"""flare-diag as operators install it: a wheel that collides with no other distribution and ships
what an operator needs, annotated site templates, and units that systemd accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flare_diag.daemon.cli.commands import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip install .` would install, built from this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    # from a copy without build outputs: setuptools builds in the source folder, and a stale build/
    # there would put files into the wheel that the checkout no longer has
    src = tmp_path_factory.mktemp("src") / "flare-diag"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                            ".hypothesis", ".pytest_cache", "test-artifacts", "out"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return next(out.glob("flare_diag-*.whl"))


def test_the_wheel_installs_one_top_level_package_named_flare_diag(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"flare_diag"}


def test_the_wheel_ships_the_units_the_site_templates_the_build_script_and_the_docs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {"flare_diag/share/systemd/flare-diagd.service", "flare_diag/share/systemd/flare-diag.sysusers.conf",
               "flare_diag/share/systemd/flare-diag.tmpfiles.conf", "flare_diag/share/docs/operations.md",
               "flare_diag/share/docs/site-profile.md", "flare_diag/fixtures/engines/llamacpp/build.sh",
               "flare_diag/daemon/fleet/migrations/001_init.sql",
               # what `flare-diag rehearse` runs with no arguments: the shipped plan and its 52 bodies
               "flare_diag/fixtures/plans/2026-10-22-cache-diagnosis.toml", "flare_diag/fixtures/data/c1-52/bodies.jsonl",
               "flare_diag/fixtures/plans/fleet-drill.toml",  # docs/fleet.md's drill
               "flare_diag/fixtures/data/c1-52/manifest.json",
               *(f"flare_diag/daemon/templates/{k}.toml" for k in ("flare", "vllm", "sglang", "llamacpp"))}
    assert shipped <= names, shipped - names
    docs = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("flare_diag/share/docs/") and n.endswith(".md")} == docs


def test_the_wheel_leaves_the_simulators_http_stack_to_the_sim_extra(wheel):
    meta = zipfile.ZipFile(wheel).read(next(n for n in zipfile.ZipFile(wheel).namelist()
                                            if n.endswith(".dist-info/METADATA"))).decode()
    plain = [line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not [d for d in plain if "starlette" in d or "uvicorn" in d], plain
    assert re.search(r"Requires-Dist: starlette.*extra == .sim", meta)


def _fresh_venv(tmp_path: Path, *requirements: str) -> Path:
    """A new virtual environment holding `requirements` and what they need, as pip resolves them. The
    venv gets no pip of its own (installing one into it was 5 s a test): the suite's pip installs into
    it (`pip --python`), without compiling every installed module ahead (1.8 s of CPU over the file):
    what the tests run is compiled as it is imported, as it would be then."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile",
                        *requirements], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return venv


def test_python_daemon_and_fixtures_installed_beside_flare_diag_all_import_and_rehearse_works(wheel, tmp_path, small_plan):
    venv = _fresh_venv(tmp_path, f"{wheel}[sim]", "python-daemon", "fixtures")
    py = venv / "bin" / "python"
    probe = ("import daemon, daemon.daemon, fixtures, flare_diag.daemon.cli.commands, flare_diag.fixtures.flaresim.host;"
             "print(daemon.daemon.DaemonContext.__name__, fixtures.Fixture.__name__)")
    p = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.split() == ["DaemonContext", "Fixture"], p.stderr[-2000:]
    # the shipped plan's shape on the eight-body working set: the installed simulator, fixtures and
    # reports, in a second rather than the five of the 52 bodies (the wheel test above checks they ship)
    p = subprocess.run([str(venv / "bin" / "flare-diag"), "rehearse", "--plan", str(small_plan), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    assert (tmp_path / "out" / "report.html").is_file()


def test_a_production_install_has_no_simulator_stack_and_rehearse_says_which_extra_to_install(wheel, tmp_path):
    venv = _fresh_venv(tmp_path, str(wheel))
    p = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; "
                        "print(u.find_spec('starlette'), u.find_spec('uvicorn'))"], capture_output=True, text=True)
    assert p.stdout.split() == ["None", "None"]
    p = subprocess.run([str(venv / "bin" / "flare-diag"), "rehearse", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 2 and "flare-diag[sim]" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_init_site_writes_a_profile_and_0600_token_placeholders_and_never_overwrites(tmp_path, capsys):
    assert main(["init-site", "vllm", str(tmp_path / "sites"), "--name", "gpu7"]) == 0
    profile = tmp_path / "sites" / "gpu7.toml"
    assert profile.is_file() and "metrics_profile = \"vllm\"" in profile.read_text()
    tokens = sorted((tmp_path / "sites").glob("*.token"))
    assert [t.name for t in tokens] == ["serving.token"]  # a bare vLLM the daemon runs: no other service
    assert all(t.stat().st_mode & 0o777 == 0o600 for t in tokens)
    capsys.readouterr()
    assert main(["init-site", "vllm", str(tmp_path / "sites"), "--name", "gpu7"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_a_profile_whose_token_file_still_holds_the_placeholder_is_refused_naming_it(tmp_path, capsys):
    assert main(["init-site", "flare", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["site", "check", str(tmp_path / "flare.toml")]) == 2
    err = capsys.readouterr().err
    assert "serving.token" in err and "placeholder" in err and len(err.strip().splitlines()) == 1


def test_init_site_writes_a_profile_that_site_check_accepts_against_flaresim(tmp_path, capsys):
    from tests.daemontools import Sim
    sim = Sim(tmp_path)
    try:
        assert main(["init-site", "flare", str(tmp_path / "sites")]) == 0
        profile = tmp_path / "sites" / "flare.toml"
        text = profile.read_text()
        # what an operator edits: the URLs, the candidate's name, the tokens; a simulator's GPUs
        for port, where in (("8000", ""), ("8001", ""), ("8002", "/routed"), ("8003", "")):
            text = text.replace(f"http://127.0.0.1:{port}", sim.url + where)
        text = text.replace("REPLACE-candidate-recipe-name", "glm-candidate")
        text = text.replace('source = "nvml"', f'source = "sim"\nurl = "{sim.url}"\ntoken_file = "serving.token"')
        profile.write_text(text)
        for t in (tmp_path / "sites").glob("*.token"):
            t.write_text(sim.token + "\n")
        capsys.readouterr()
        rc = main(["site", "check", str(profile), "--plan", str(ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml")])
        assert rc == 0, capsys.readouterr().out
    finally:
        sim.stop()


def test_share_prints_where_the_shipped_files_are(capsys):
    assert main(["share", "--json"]) == 0
    import json
    where = json.loads(capsys.readouterr().out)
    assert (Path(where["systemd"]) / "flare-diagd.service").is_file()
    assert (Path(where["docs"]) / "site-profile.md").is_file()
    assert Path(where["engine_build_script"]).is_file()
    assert (Path(where["plans"]) / "fleet-drill.toml").is_file()  # docs/fleet.md's drill finds its plan here


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _unit_for_here(tmp_path: Path) -> Path:
    """The shipped unit with ExecStart pointing at this environment's flare-diagd (verify checks it exists)."""
    here = Path(sys.executable).parent / "flare-diagd"
    unit = tmp_path / "flare-diagd.service"
    unit.write_text((ROOT / "systemd" / "flare-diagd.service").read_text().replace("/usr/bin/flare-diagd", str(here)))
    return unit


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd is not installed here")
def test_systemd_analyze_verify_accepts_the_shipped_unit(tmp_path):
    p = subprocess.run([SYSTEMD_ANALYZE, "verify", str(_unit_for_here(tmp_path))], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    problems = [line for line in (p.stdout + p.stderr).splitlines() if "flare-diagd.service" in line]
    assert problems == []


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd is not installed here")
def test_systemd_sysusers_reads_the_shipped_sysusers_file():
    p = subprocess.run(["systemd-sysusers", "--dry-run", str(ROOT / "systemd" / "flare-diag.sysusers.conf")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "Failed" not in p.stderr, p.stderr


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd is not installed here")
def test_the_shipped_units_security_exposure_is_at_most_2_5(tmp_path):
    p = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", str(_unit_for_here(tmp_path))],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r"Overall exposure level for flare-diagd.service: ([\d.]+)", p.stdout + p.stderr)
    assert m, p.stdout[-2000:] + p.stderr[-2000:]
    assert float(m.group(1)) <= 2.5


def test_every_package_folder_of_the_layers_is_listed_for_the_wheel():
    # setuptools ships only the packages pyproject.toml lists: a new folder left out imports in the checkout
    # (an editable install) and is missing from every real install
    import tomllib
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    folders = {"daemon": "flare_diag.daemon", "events": "flare_diag.events", "policies": "flare_diag.policies",
               "fixtures": "flare_diag.fixtures"}
    missing = sorted(f"{pkg}{'.' + '.'.join(init.parent.relative_to(ROOT / top).parts) if init.parent != ROOT / top else ''}"
                     for top, pkg in folders.items() for init in (ROOT / top).rglob("__init__.py")
                     if "__pycache__" not in init.parts)
    assert [m for m in missing if m not in listed] == []
