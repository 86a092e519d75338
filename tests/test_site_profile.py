"""Site profiles: unknown keys refused, token files relative or from systemd credentials, tokens kept out of errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from flare_diag.daemon.hosts.site import SiteError, load_site

PROFILE = """
[serving]
url = "http://127.0.0.1:8100"
token_file = "{tf}"
[manager]
url = "http://127.0.0.1:8100"
candidate_recipe = "glm-candidate"
"""


def test_token_file_is_read_relative_to_the_profile(tmp_path):
    (tmp_path / "serving.token").write_text("s3cret-relative\n")
    (tmp_path / "site.toml").write_text(PROFILE.format(tf="serving.token"))
    assert load_site(tmp_path / "site.toml").tokens["serving"] == "s3cret-relative"


def test_credential_token_is_read_from_the_systemd_credentials_directory(tmp_path, monkeypatch):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "serving.token").write_text("s3cret-credential")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    (tmp_path / "site.toml").write_text(PROFILE.format(tf="credential:serving.token"))
    assert load_site(tmp_path / "site.toml").tokens["serving"] == "s3cret-credential"


def test_credential_token_without_a_credentials_directory_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    (tmp_path / "site.toml").write_text(PROFILE.format(tf="credential:serving.token"))
    with pytest.raises(SiteError, match="CREDENTIALS_DIRECTORY"):
        load_site(tmp_path / "site.toml")


def test_unknown_key_is_refused_naming_it(tmp_path):
    (tmp_path / "serving.token").write_text("x")
    (tmp_path / "site.toml").write_text(PROFILE.format(tf="serving.token") + 'colour = "blue"\n')
    with pytest.raises(SiteError, match="colour"):
        load_site(tmp_path / "site.toml")


def test_a_token_never_appears_in_the_site_or_its_errors(tmp_path):
    (tmp_path / "serving.token").write_text("s3cret-never-shown")
    (tmp_path / "site.toml").write_text(PROFILE.format(tf="serving.token"))
    site = load_site(tmp_path / "site.toml")
    assert "s3cret-never-shown" not in repr(site) and "s3cret-never-shown" not in repr(site.profile)


def test_an_empty_token_file_is_refused_naming_it(tmp_path):
    (tmp_path / "serving.token").write_text("\n")
    (tmp_path / "site.toml").write_text(PROFILE.format(tf="serving.token"))
    with pytest.raises(SiteError, match=r"serving.token_file 'serving.token': is empty"):
        load_site(tmp_path / "site.toml")


def test_a_world_readable_token_file_is_a_warning(tmp_path):
    tf = tmp_path / "serving.token"
    tf.write_text("s3cret")
    tf.chmod(0o644)
    (tmp_path / "site.toml").write_text(PROFILE.format(tf="serving.token"))
    site = load_site(tmp_path / "site.toml")
    assert len(site.warnings) == 1 and "readable by every user" in site.warnings[0]
    tf.chmod(0o600)
    assert load_site(tmp_path / "site.toml").warnings == []


# the last: a host no IDNA encoding takes (found by the fuzz test), which httpx refused mid-check
@pytest.mark.parametrize("url", ["ftp://host/x", "127.0.0.1:8100", "http://", "http://h:notaport", "http://.\u0080127.0.0.1:9"])
def test_a_service_url_that_is_not_http_is_refused(tmp_path, url):
    (tmp_path / "serving.token").write_text("s3cret")
    (tmp_path / "site.toml").write_text(PROFILE.format(tf="serving.token").replace("http://127.0.0.1:8100", url, 1))
    with pytest.raises(SiteError, match="serving.url .* expected an http"):
        load_site(tmp_path / "site.toml")


# --- every input bounded (issue 26) -----------------------------------------------------------

def _profile(tmp_path, token_file: str = "serving.token", url: str = "http://127.0.0.1:9") -> Path:
    p = tmp_path / "s.toml"
    p.write_text(f'[serving]\nurl = "{url}"\ntoken_file = "{token_file}"\n[manager]\nurl = "http://127.0.0.1:9"\n'
                 f'candidate_recipe = "c"\n[gpu]\nsource = "none"\n')
    return p


def test_a_token_file_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path):
    from flare_diag.daemon.hosts.site import SiteError, load_site
    import pytest
    with pytest.raises(SiteError, match="expected a regular file"):
        load_site(_profile(tmp_path, token_file="/dev/zero"))


def test_a_token_file_larger_than_a_token_is_refused(tmp_path):
    from flare_diag.daemon.hosts.site import SiteError, load_site
    import pytest
    (tmp_path / "big.token").write_bytes(b"x" * 100_000)
    with pytest.raises(SiteError, match="larger than 4096 bytes"):
        load_site(_profile(tmp_path, token_file="big.token"))


def test_a_url_of_a_hundred_kilobytes_is_one_line(tmp_path):
    from flare_diag.daemon.hosts.site import SiteError, load_site
    import pytest
    (tmp_path / "serving.token").write_text("tok-tok-tok\n")
    with pytest.raises(SiteError, match="at most 2048 characters"):
        load_site(_profile(tmp_path, url="http://" + "a" * 100_000))


def test_init_site_writes_only_inside_the_folder_it_is_given(tmp_path, capsys):
    from flare_diag.daemon.cli.commands import main
    rc = main(["init-site", "flare", str(tmp_path / "sites"), "--name", str(tmp_path / "elsewhere" / "x")])
    assert rc == 2 and "init-site writes only inside" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere").exists()


def test_a_metrics_key_that_names_no_contract_family_is_refused_naming_the_key(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text('metrics_profile = "vllm"\n[serving]\nurl = "http://127.0.0.1:9"\n[manager]\nurl = "http://127.0.0.1:9"\ncandidate_recipe = "c"\n'
                    '[metrics]\nhost_reused_tokens = "vllm:prompt_tokens_by_source"\n')
    with pytest.raises(SiteError, match=r"metrics\.host_reused_tokens: not a contract metric family; did you mean "
                                        r"flare_host_cache_reused_tokens"):
        load_site(site)
