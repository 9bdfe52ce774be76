"""The client's config file and token, as a new user meets them: a misspelt
key is named with the key meant, and a refused token says where it came from."""

from __future__ import annotations

from tests.helpers.harness import Cli


def test_a_refused_token_says_where_it_came_from(controller, env, tmp_path):
    """Found by a new user: `unauthorized: unknown or revoked token` with three
    places a token can come from and no word of which one was used."""
    cli = Cli(controller.url, "rc_not-a-real-token", env, tmp_path)
    res = cli.run("devices")
    assert res.returncode == 1
    assert res.stderr == (
        b"rc: unauthorized: unknown or revoked token (the token came from RC_TOKEN)\n"
    )
    conf = tmp_path / "conf.toml"
    conf.write_text('token = "rc_stale"\n')
    del cli.env["RC_TOKEN"]
    cli.env["RC_CONFIG"] = str(conf)
    res = cli.run("devices")
    assert res.returncode == 1
    assert res.stderr.decode() == (
        f"rc: unauthorized: unknown or revoked token (the token came from {conf})\n"
    )
    res = cli.run("devices", "--token", "rc_flag")
    assert res.stderr.endswith(b"(the token came from --token)\n"), res.stderr
